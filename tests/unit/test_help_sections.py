"""validate --help lists every option under the heading of what it is for, defaults shown."""

from __future__ import annotations

from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.cli.validate import SECTIONS, validate


def test_every_validate_option_has_a_section_and_only_one() -> None:
    named = [name for names in SECTIONS.values() for name in names]
    options = [param.name for param in validate.params]
    assert sorted(named) == sorted(options)


def test_validate_help_shows_the_sections_in_order_with_defaults() -> None:
    result = CliRunner().invoke(main, ["validate", "--help"])
    assert result.exit_code == 0
    headings = [line[:-1] for line in result.output.splitlines() if line and line[0] != " "]
    assert headings[-len(SECTIONS) - 1 :] == [*SECTIONS, "Other options"]
    assert "--k INTEGER RANGE  num_speculative_tokens.  [default: 3; 1<=x<=16]" in result.output
    other = result.output.split("Other options:\n", 1)[1]
    assert other.split() == ["-h,", "--help", "Show", "this", "message", "and", "exit."]
