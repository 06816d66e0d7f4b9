"""Configuration stage, documented: docs/config_reference.md generated from the schema.

`python -m agentrl.config_docs > docs/config_reference.md` writes the page. It holds exactly the
lines `python -m agentrl.train --describe` prints (every key with its default and meaning, the
default presets applied), one block per top-level section. tests/test_docs.py regenerates the
page and fails, naming this command, when the committed page differs.
"""

from __future__ import annotations

import sys

import yaml

from agentrl.config_loader import DEFAULTS_FILE, config_groups, configs_root, describe_config, load_config

REGENERATE_COMMAND = "python -m agentrl.config_docs > docs/config_reference.md"


def config_reference() -> str:
    """The Markdown text of docs/config_reference.md for the schema and presets as they are now."""
    lines = describe_config(load_config([]))
    sections = list(dict.fromkeys(line.split(".", 1)[0] for line in lines))
    defaults = yaml.safe_load((configs_root() / DEFAULTS_FILE).read_text())["defaults"]
    chosen = " ".join(f"{group}={name}" for group, name in defaults.items())
    presets = "; ".join(f"`{group}={'|'.join(names)}`" for group, names in sorted(config_groups().items()))
    page = [
        "# Config reference",
        "",
        f"Generated from the schema by `{REGENERATE_COMMAND}`; do not edit it by hand:",
        "`tests/test_docs.py` fails when this page and the schema differ.",
        "",
        "Each line is one setting as `python -m agentrl.train --describe` prints it:",
        "`key = default  # meaning`. The defaults are the schema's with the default presets applied",
        f"(`{chosen}`, chosen in `configs/defaults.yaml`). Set a key on the command line as",
        "`key.sub=value`; `python -m agentrl.train env=code_sandbox --describe` prints the values another",
        "preset sets, and `--describe actor.clip` only the keys that start with `actor.clip`.",
        "",
        f"Presets: {presets}.",
        "",
        "Sections: " + " · ".join(f"[{section}](#{section})" for section in sections) + ".",
    ]
    for section in sections:
        page += ["", f"## {section}", "", "```text"]
        page += [line for line in lines if line.split(".", 1)[0] == section]
        page += ["```"]
    return "\n".join(page) + "\n"


if __name__ == "__main__":
    sys.stdout.write(config_reference())
