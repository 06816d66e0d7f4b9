// agentrl run viewer: follows live runs and switches the token colouring. No dependencies.
"use strict";

const POLL_MS = 2000;

async function currentVersion() {
  const url = document.getElementById("live").dataset.versionUrl;
  const response = await fetch(url, { cache: "no-store" });
  return (await response.json()).version;
}

// Re-fetch this page and swap its content when any run wrote something new, unless the
// reader is typing into a form (a refresh would drop what they typed).
async function followLiveRuns() {
  let seen = await currentVersion();
  setInterval(async () => {
    try {
      const version = await currentVersion();
      if (version === seen || document.activeElement.closest("form")) return;
      const response = await fetch(window.location.href, { cache: "no-store" });
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      document.getElementById("live").innerHTML = page.getElementById("live").innerHTML;
      seen = version;
    } catch (error) {
      console.warn("live update failed", error);
    }
  }, POLL_MS);
}

function advantageColour(advantage) {
  const strength = Math.min(Math.abs(advantage), 2) / 2;
  const alpha = 0.15 + 0.6 * strength;
  return advantage >= 0 ? `rgba(44, 160, 44, ${alpha})` : `rgba(214, 39, 40, ${alpha})`;
}

function setUpColourModes() {
  for (const tokens of document.querySelectorAll(".tokens[data-advantage]")) {
    tokens.style.setProperty("--advantage-colour", advantageColour(parseFloat(tokens.dataset.advantage)));
  }
  for (const radio of document.querySelectorAll(".colour-modes input[name=mode]")) {
    radio.addEventListener("change", () => {
      for (const article of document.querySelectorAll("article.trajectory")) {
        article.classList.remove("mode-mask", "mode-logprob", "mode-advantage");
        article.classList.add(`mode-${radio.value}`);
      }
    });
  }
}

document.addEventListener("DOMContentLoaded", () => {
  setUpColourModes();
  if (document.body.dataset.live === "1") followLiveRuns();
});
