"""docs/environments.md shows the example agent the tests run: the two must not drift apart."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_readme_shows_the_tested_example_agent_verbatim():
    example = (ROOT / "services" / "demo" / "openai_agent.py").read_text()
    page = (ROOT / "docs" / "environments.md").read_text()
    assert "\n" + example + "```" in page
