"""The viewer in a real headless Chromium: click from the runs page down to tokens, and follow a live run."""

from __future__ import annotations

import json

from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.viewer.run_dirs import STEP_1, write_jsonl


def texts(browser, selector: str) -> list[str]:
    return [element.text for element in browser.find_elements(By.CSS_SELECTOR, selector)]


def navigate(browser, element) -> None:
    """Click `element` and wait until the next page has loaded in place of this one.

    The page being left is marked by a script variable, which the next page does not have. While
    the document is being replaced, the driver's calls can fail in several ways (a stale node, a
    node that "does not belong to the document", a script context that is gone): each only means
    that the next page is not there yet.
    """
    browser.execute_script("window.pageBeingLeft = true")
    element.click()
    WebDriverWait(browser, 15, ignored_exceptions=(WebDriverException,)).until(
        lambda driver: driver.execute_script(
            "return window.pageBeingLeft === undefined && document.readyState === 'complete'"
        )
    )


def click_link(browser, text: str) -> None:
    navigate(browser, browser.find_element(By.LINK_TEXT, text))


def test_clicking_from_the_runs_page_to_a_trajectory_shows_its_turns_tokens_and_advantage(
    browser, viewer, screenshots
):
    browser.get(viewer)
    assert texts(browser, "tr.run-row td.num-steps") == ["3"]
    browser.save_screenshot(str(screenshots / "1_runs.png"))
    click_link(browser, "math_run")
    assert texts(browser, "figure.plot-box figcaption") == [
        "reward",
        "accuracy",
        "response length (sampled tokens)",
        "statuses (fraction of trajectories)",
        "timings (s)",
        "losses",
        "gradient norm",
    ]  # no entropy: the run never logged it
    assert [row.get_attribute("data-step") for row in browser.find_elements(By.CSS_SELECTOR, "tr.step-row")] == [
        "0", "1", "2",
    ]  # fmt: skip
    browser.save_screenshot(str(screenshots / "2_run.png"))
    navigate(
        browser, browser.find_element(By.CSS_SELECTOR, "tr.step-row[data-step='1'] a[data-split='train']")
    )
    assert browser.find_element(By.CSS_SELECTOR, "p.count").text == "4 of 4 trajectories in 2 groups"
    assert texts(browser, "section.group[data-group='7'] td.advantage") == ["+0.7071", "-0.7071"]
    assert texts(browser, "section.group[data-group='9'] td.status") == ["completed", "env_error"]
    browser.save_screenshot(str(screenshots / "3_step.png"))
    click_link(browser, "trajectory 1")
    assert browser.find_element(By.CSS_SELECTOR, "dd.status").text == "truncated_turns"
    assert browser.find_element(By.CSS_SELECTOR, "dd.advantage").text == "-0.7071"
    assert texts(browser, "li.turn pre") == [
        "\\boxed{5}",
        "Your answer is incorrect. Try again.",
        "\\boxed{4}",
    ]
    sampled = "".join(texts(browser, ".tokens .tok.sampled"))
    assert sampled == "\\boxed{5}<|im_end|>\\boxed{4}<|im_end|>"
    observation = "".join(texts(browser, ".tokens .tok.observation"))
    assert (
        observation
        == "↵\n<|im_start|>user↵\nYour answer is incorrect. Try again.<|im_end|>↵\n<|im_start|>assistant↵\n".replace(
            "\n", ""
        )
    )
    assert texts(browser, ".tokens .tok.sampled.lp3") == ["5"]
    browser.save_screenshot(str(screenshots / "4_trajectory.png"))


def background(browser, selector: str) -> str:
    return browser.find_element(By.CSS_SELECTOR, selector).value_of_css_property("background-color")


def test_colouring_switches_between_loss_mask_logprob_and_advantage(browser, viewer, screenshots):
    browser.get(f"{viewer}/runs/math_run/train/1/1")
    low = ".tokens .tok.sampled.lp3"
    assert background(browser, low) == "rgba(255, 233, 168, 1)"  # mask colour: sampled
    browser.find_element(By.CSS_SELECTOR, "input[value='logprob']").click()
    assert background(browser, low) == "rgba(255, 80, 80, 1)"  # the unlikely token stands out
    assert background(browser, ".tokens .tok.sampled.lp0") == "rgba(243, 243, 243, 1)"
    browser.find_element(By.CSS_SELECTOR, "input[value='advantage']").click()
    assert background(browser, low) == "rgba(214, 39, 40, 0.36)"  # negative advantage: red
    browser.save_screenshot(str(screenshots / "5_advantage_colours.png"))


def test_legend_entries_have_the_colour_of_their_series(browser, viewer):
    browser.get(f"{viewer}/runs/math_run")
    plots = browser.find_elements(By.CSS_SELECTOR, "svg.plot")
    assert len(plots) == 7
    for plot in plots:
        colours = browser.execute_script(
            """const svg = arguments[0];
            const fill = (node) => getComputedStyle(node).fill;
            return [[...svg.querySelectorAll("text.legend")].map(fill),
                    [...svg.querySelectorAll("polyline")].map((line) => getComputedStyle(line).stroke)];""",
            plot,
        )
        assert colours[0] == colours[1], plot.get_attribute("aria-label")
    reward = browser.find_element(By.CSS_SELECTOR, "svg.plot[aria-label='reward'] text.legend")
    assert reward.value_of_css_property("fill") == "rgb(31, 119, 180)"


def test_a_negative_axis_value_is_drawn_whole_with_its_sign_left_of_the_frame(browser, viewer, screenshots):
    browser.get(f"{viewer}/runs/math_run")
    for plot in browser.find_elements(By.CSS_SELECTOR, "svg.plot"):
        frame_left, labels = browser.execute_script(
            """const svg = arguments[0];
            const ends = [...svg.querySelectorAll("text[text-anchor='end']")].slice(0, 2);  // the y-axis labels
            return [svg.querySelector("rect").getBBox().x, ends.map((label) => {
                const box = label.getBBox();
                return [label.textContent, box.x, box.x + box.width];
            })];""",
            plot,
        )
        name = plot.get_attribute("aria-label")
        if name == "losses":
            assert [text for text, _, _ in labels] == ["0.0012", "-0.003712"]
        for text, left, right in labels:
            assert 0 <= left and right <= frame_left, (name, text, left, right)
    losses = browser.find_element(By.CSS_SELECTOR, "svg.plot[aria-label='losses']")
    assert texts(losses, "text.legend") == ["\u25a0 actor/pg_loss"]  # no kl_loss: the KL term was off
    losses.screenshot(str(screenshots / "7_negative_axis.png"))


def test_filters_keep_only_the_asked_status_and_reward_range(browser, viewer):
    browser.get(f"{viewer}/runs/math_run/train/1")
    Select(browser.find_element(By.NAME, "status")).select_by_visible_text("env_error")
    navigate(browser, browser.find_element(By.CSS_SELECTOR, "form.filters button"))
    assert browser.find_element(By.CSS_SELECTOR, "p.count").text == "1 of 4 trajectories in 1 groups"
    assert [
        r.get_attribute("data-index") for r in browser.find_elements(By.CSS_SELECTOR, "tr.trajectory-row")
    ] == ["3"]
    browser.get(f"{viewer}/runs/math_run/train/1?min_reward=0.5")
    assert [
        r.get_attribute("data-index") for r in browser.find_elements(By.CSS_SELECTOR, "tr.trajectory-row")
    ] == ["0"]


def test_a_filtered_step_page_shows_each_groups_own_size_and_mean_reward(browser, viewer):
    browser.get(f"{viewer}/runs/math_run/train/1?min_reward=0.5")
    assert texts(browser, "section.group .group-stats") == ["2 trajectories (1 shown), mean reward 0.5"]
    browser.get(f"{viewer}/runs/math_run/train/1?status=env_error")
    assert texts(browser, "section.group .group-stats") == [
        "2 trajectories (1 shown), mean reward 0 without the 1 with an error status"
    ]
    browser.get(f"{viewer}/runs/math_run/train/1")
    assert texts(browser, "section.group .group-stats") == [
        "2 trajectories, mean reward 0.5",
        "2 trajectories, mean reward 0 without the 1 with an error status",
    ]


def test_two_trajectories_of_a_group_show_side_by_side(browser, viewer, screenshots):
    browser.get(f"{viewer}/runs/math_run/train/1")
    navigate(
        browser, browser.find_element(By.CSS_SELECTOR, "section.group[data-group='7'] form.compare button")
    )
    articles = browser.find_elements(By.CSS_SELECTOR, "article.trajectory")
    assert [a.get_attribute("data-index") for a in articles] == ["0", "1"]
    assert texts(browser, "article.trajectory dd.reward") == ["1", "0"]
    left, right = (a.rect for a in articles)
    assert left["y"] == right["y"] and left["x"] < right["x"]  # columns, not stacked
    browser.save_screenshot(str(screenshots / "6_side_by_side.png"))


def test_a_step_written_while_the_page_is_open_appears_without_a_restart(browser, viewer, run_dir):
    browser.get(f"{viewer}/runs/math_run")
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr.step-row")) == 3
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": 3, "reward/mean": 0.75}) + "\n")
    write_jsonl(run_dir / "rollouts" / "step_3.jsonl", STEP_1)
    WebDriverWait(browser, 15).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, "tr.step-row[data-step='3'] a[data-split='train']")
    )
    assert texts(browser, "tr.step-row[data-step='3'] td")[:2] == ["3", "0.75"]
