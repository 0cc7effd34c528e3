"""Eval scorers and reducers (runtime.eval.scorers)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from coterie.runtime.errors import CoterieError
from coterie.runtime.eval.scorers import (
    DEFAULT_GRADER_INSTRUCTIONS,
    ModelGradedScorer,
    Score,
    ScorerError,
    build_scorer,
    build_scorers,
    grader_of,
    needs_grader,
    parse_choice,
    parse_number,
    reduce_scores,
)
from coterie.runtime.eval.task import (
    ChoiceSpec,
    DatasetSpec,
    EvalTask,
    ExactSpec,
    IncludesSpec,
    ModelGradedSpec,
    NumericSpec,
    PythonSpec,
    RegexSpec,
    Sample,
    ScorerSpec,
    SolverSpec,
    TaskFileError,
)

HERE = Path(".")


def sample(target: str | list[str] = "", input: str = "the question") -> Sample:
    return Sample(id="s1", input=input, target=target)


async def score(spec: ScorerSpec, target: str | list[str], output: str) -> Score:
    return await build_scorer(spec, base_dir=HERE).score(sample(target), output)


async def value(spec: ScorerSpec, target: str | list[str], output: str) -> float:
    return (await score(spec, target, output)).value


# -- exact and includes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("Paris", 1.0),
        ("  paris.  ", 1.0),
        ("PARIS", 1.0),
        ("Paris, France", 0.0),
        ("Pari", 0.0),
        ("", 0.0),
    ],
)
async def test_exact(output: str, expected: float) -> None:
    assert await value(ExactSpec(), "Paris", output) == expected


async def test_exact_collapses_whitespace_and_reports() -> None:
    result = await score(ExactSpec(), "New York", "new\n  york.")
    assert result == Score(
        value=1.0, answer="new york", explanation="matches the target 'New York'"
    )
    result = await score(ExactSpec(), ["a", "b"], "c")
    assert result == Score(value=0.0, answer="c", explanation="expected 'a' or 'b'")
    assert await value(ExactSpec(), ["a", "b"], " B ") == 1.0


async def test_exact_options() -> None:
    assert await value(ExactSpec(ignore_case=False), "Paris", "paris") == 0.0
    assert await value(ExactSpec(ignore_case=False), "Paris", "Paris.") == 1.0
    assert await value(ExactSpec(strip=False), "Paris", " Paris") == 0.0
    assert await value(ExactSpec(strip=False), "Paris", "Paris.") == 0.0
    assert await value(ExactSpec(strip=False), "Paris", "paris") == 1.0


async def test_includes() -> None:
    assert await value(IncludesSpec(), "paris", "It is PARIS, of course.") == 1.0
    assert await value(IncludesSpec(ignore_case=False), "paris", "It is PARIS") == 0.0
    assert await value(IncludesSpec(), " paris ", "Paris!") == 1.0
    result = await score(IncludesSpec(), ["Lyon", "Paris"], "paris")
    assert result == Score(value=1.0, answer="Paris", explanation="matches the target 'Paris'")
    result = await score(IncludesSpec(), "Rome", "Paris")
    assert result == Score(value=0.0, answer=None, explanation="expected 'Rome'")


async def test_scorers_that_need_a_target_raise_without_one() -> None:
    for spec in (ExactSpec(), IncludesSpec(), NumericSpec(), ChoiceSpec(), RegexSpec(pattern="x")):
        with pytest.raises(ScorerError, match=f"scorer '{spec.type}' needs a target; sample 's1'"):
            await score(spec, "", "x")
    with pytest.raises(ScorerError, match="only blank targets"):
        await score(IncludesSpec(), ["  "], "x")
    assert issubclass(ScorerError, CoterieError)


# -- regex ----------------------------------------------------------------------------------


async def test_regex_whole_match_and_groups() -> None:
    spec = RegexSpec(pattern=r"ANSWER: (\w+)", group=1)
    result = await score(spec, "42", "thinking... ANSWER: 42")
    assert result.value == 1.0 and result.answer == "42"
    assert await value(spec, "42", "ANSWER: 41") == 0.0
    named = RegexSpec(pattern=r"final=(?P<v>\d+)", group="v")
    assert (await score(named, ["7", "8"], "final=8")).answer == "8"
    assert await value(named, ["7", "8"], "final=8") == 1.0
    whole = RegexSpec(pattern=r"\d+")
    assert (await score(whole, "12", "a 12 b 13")).answer == "12"  # the first match


async def test_regex_no_match_and_case() -> None:
    spec = RegexSpec(pattern=r"answer: (\w+)", group=1)
    result = await score(spec, "yes", "ANSWER: yes")
    assert result == Score(value=0.0, explanation="no match of 'answer: (\\\\w+)'")
    loose = RegexSpec(pattern=r"answer: (\w+)", group=1, ignore_case=True)
    assert await value(loose, "YES", "ANSWER: yes") == 1.0
    # An optional group that did not take part is no answer.
    optional = RegexSpec(pattern=r"x(y)?", group=1)
    assert (await score(optional, "y", "x")).answer is None


async def test_regex_without_a_target() -> None:
    spec = RegexSpec(pattern=r"^def \w+\(", match_target=False)
    assert await value(spec, "", "def f(x): pass") == 1.0
    assert await value(spec, "", "lambda x: x") == 0.0


# -- numeric --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("The answer is 42.", 42.0),
        ("1,234.5 in total", 1234.5),
        ("from 3 to -3", -3.0),
        ("about 2e3 m", 2000.0),
        ("costs $1,000,000", 1_000_000.0),
        ("gpt-4 says 7", 7.0),
        ("gpt-4", 4.0),
        ("range 3-4", 4.0),
        ("pi is .5 off", 0.5),
        ("−2 with a unicode minus", -2.0),
        ("12kg", 12.0),
        ("no digits here", None),
    ],
)
def test_parse_number(text: str, number: float | None) -> None:
    assert parse_number(text) == number


async def test_numeric_exact_and_tolerance() -> None:
    assert await value(NumericSpec(), "1234.5", "so it is 1,234.5") == 1.0
    assert await value(NumericSpec(), "1,234.5", "1234.50") == 1.0
    assert await value(NumericSpec(), "3", "2 then 3.5") == 0.0
    assert await value(NumericSpec(tolerance=0.5), "3", "3.5") == 1.0
    assert await value(NumericSpec(tolerance=0.1), "1.0", "1.1") == 1.0  # float rounding aside
    assert await value(NumericSpec(tolerance=0.1), "1.0", "1.11") == 0.0
    assert await value(NumericSpec(), ["10", "-3"], "I get -3") == 1.0
    result = await score(NumericSpec(), "5", "I got 4.0")
    assert result == Score(value=0.0, answer="4", explanation="expected '5'")


async def test_numeric_relative_tolerance() -> None:
    spec = NumericSpec(tolerance=0.01, relative=True)
    assert await value(spec, "1000", "1,010") == 1.0
    assert await value(spec, "1000", "1,011") == 0.0
    assert await value(spec, "-200", "-198") == 1.0
    assert await value(spec, "0", "0.0001") == 0.0


async def test_numeric_edge_cases() -> None:
    result = await score(NumericSpec(), "3", "three")
    assert result == Score(value=0.0, explanation="no number in the output")
    with pytest.raises(ScorerError, match="target 'three' of sample 's1' is not a number"):
        await score(NumericSpec(), "three", "3")
    with pytest.raises(ScorerError, match="is not a number"):
        await score(NumericSpec(), "3 apples", "3")


# -- choice ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "letter"),
    [
        ("ANSWER: B", "B"),
        ("Reasoning... answer: c", "C"),
        ("ANSWER: (D)", "D"),
        ("First I thought ANSWER: A, but ANSWER: B", "B"),
        ("(B)", "B"),
        ("b", "B"),
        (" C. ", "C"),
        ("The correct option is (c).", "C"),
        ("B. Paris is the capital", "B"),
        ("I would say D.", "D"),
        ("e.g. the U.S. is big", None),
        ("the answer(s) are unclear", None),
        ("no letter here", None),
    ],
)
def test_parse_choice(output: str, letter: str | None) -> None:
    assert parse_choice(output) == letter


async def test_choice() -> None:
    assert await value(ChoiceSpec(), "B", "ANSWER: b") == 1.0
    assert await value(ChoiceSpec(), "b", "(B)") == 1.0
    assert await value(ChoiceSpec(), "(A)", "A.") == 1.0
    assert await value(ChoiceSpec(), ["A", "C"], "ANSWER: C") == 1.0
    result = await score(ChoiceSpec(), "A", "ANSWER: B")
    assert result == Score(value=0.0, answer="B", explanation="expected 'A'")
    result = await score(ChoiceSpec(), "A", "I am not sure")
    assert result == Score(value=0.0, explanation="no answer letter in the output")
    with pytest.raises(ScorerError, match="expected a letter A-Z"):
        await score(ChoiceSpec(), "AB", "A")


# -- python ---------------------------------------------------------------------------------


SCORER_MODULE = """\
import asyncio

from coterie.runtime.eval.scorers import Score


def is_yes(sample, output):
    return output.strip() == "yes"


def length(sample, output):
    return len(output) / 10


async def async_score(sample, output):
    await asyncio.sleep(0)
    return Score(value=0.25, answer=output, explanation=sample.id)


async def async_bool(sample, output):
    return output == sample.target


def boom(sample, output):
    raise KeyError("nope")


def weird(sample, output):
    return "yes"


def nan(sample, output):
    return float("nan")
"""


@pytest.fixture
def scorer_dir(tmp_path: Path) -> Path:
    (tmp_path / "myscorers.py").write_text(SCORER_MODULE, encoding="utf-8")
    return tmp_path


async def run_python(base_dir: Path, func: str, output: str, target: str = "") -> Score:
    spec = PythonSpec(function=f"myscorers.py:{func}")
    return await build_scorer(spec, base_dir=base_dir).score(sample(target), output)


async def test_python_scorers_sync_and_async(scorer_dir: Path) -> None:
    assert await run_python(scorer_dir, "is_yes", " yes ") == Score(value=1.0)
    assert await run_python(scorer_dir, "is_yes", "no") == Score(value=0.0)
    assert await run_python(scorer_dir, "length", "abcde") == Score(value=0.5)
    assert await run_python(scorer_dir, "async_score", "out") == Score(
        value=0.25, answer="out", explanation="s1"
    )
    assert await run_python(scorer_dir, "async_bool", "x", target="x") == Score(value=1.0)


async def test_python_scorer_failures_are_scorer_errors(scorer_dir: Path) -> None:
    with pytest.raises(ScorerError) as info:
        await run_python(scorer_dir, "boom", "x")
    assert str(info.value) == (
        "scorer 'python' (myscorers.py:boom) failed on sample 's1': KeyError: 'nope'"
    )
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(ScorerError, match=r"returned 'yes'; expected a bool, a finite number"):
        await run_python(scorer_dir, "weird", "x")
    with pytest.raises(ScorerError, match=r"returned nan"):
        await run_python(scorer_dir, "nan", "x")


async def test_python_scorer_from_a_module(
    scorer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(scorer_dir))
    scorer = build_scorer(PythonSpec(name="yes", function="myscorers:is_yes"), base_dir=HERE)
    assert scorer.name == "yes"
    assert await scorer.score(sample(), "yes") == Score(value=1.0)


def make_task(scorers: list[ScorerSpec], base_dir: Path) -> EvalTask:
    return EvalTask(
        name="t",
        dataset=DatasetSpec(path="d.jsonl"),
        solver=SolverSpec(persona="p"),
        scorers=scorers,
        base_dir=base_dir,
    )


def test_build_scorers_names_the_field_of_an_unimportable_function(scorer_dir: Path) -> None:
    task = make_task(
        [
            ExactSpec(),
            PythonSpec(name="a", function="myscorers.py:missing"),
            PythonSpec(name="b", function="absent.py:f"),
        ],
        scorer_dir,
    )
    with pytest.raises(TaskFileError) as info:
        build_scorers(task)
    assert info.value.path == "<task t>"
    assert info.value.problems == [
        "scorers.1.function: cannot import 'myscorers.py:missing': "
        "myscorers.py has no attribute 'missing'",
        f"scorers.2.function: cannot import 'absent.py:f': no file {scorer_dir / 'absent.py'}",
    ]


def test_build_scorers_in_order(scorer_dir: Path) -> None:
    specs: list[ScorerSpec] = [
        ExactSpec(),
        IncludesSpec(name="inc"),
        RegexSpec(pattern="x"),
        NumericSpec(),
        ChoiceSpec(),
        PythonSpec(function="myscorers.py:is_yes"),
        ModelGradedSpec(rubric="r"),
    ]
    scorers = build_scorers(make_task(specs, scorer_dir))
    assert [s.name for s in scorers] == [
        "exact",
        "inc",
        "regex",
        "numeric",
        "choice",
        "python",
        "model_graded",
    ]


# -- model_graded ---------------------------------------------------------------------------


async def test_model_graded_with_a_fake_grader() -> None:
    prompts: list[str] = []

    async def grade(prompt: str) -> str:
        prompts.append(prompt)
        await asyncio.sleep(0)
        return "Mostly right but misses the units.\nGRADE: P"

    spec = ModelGradedSpec(rubric="Full marks need the units.")
    scorer = build_scorer(spec, base_dir=HERE)
    result = await scorer.score(sample("42 m", input="How far?"), "42", grade=grade)
    assert result == Score(
        value=0.5, answer="P", explanation="Mostly right but misses the units.\nGRADE: P"
    )
    [prompt] = prompts
    for part in ("How far?", "42 m", "[Submitted answer]\n42\n", "Full marks need the units."):
        assert part in prompt
    assert prompt.endswith(DEFAULT_GRADER_INSTRUCTIONS)
    assert "GRADE: C" in prompt and "GRADE: I" in prompt


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("GRADE: C", 1.0),
        ("GRADE: I", 0.0),
        ("first GRADE: I then on reflection GRADE:C", 1.0),
    ],
)
async def test_model_graded_grades(reply: str, expected: float) -> None:
    async def grade(prompt: str) -> str:
        return reply

    assert await build_scorer(ModelGradedSpec(rubric="r"), base_dir=HERE).score(
        sample("t"), "o", grade=grade
    ) == Score(value=expected, answer=reply[-1], explanation=reply)


async def test_model_graded_without_a_grade() -> None:
    async def grade(prompt: str) -> str:
        return "Looks fine to me."

    scorer = build_scorer(ModelGradedSpec(rubric="r"), base_dir=HERE)
    assert await scorer.score(sample("t"), "o", grade=grade) == Score(
        value=0.0, explanation="no grade in the grader's reply: Looks fine to me."
    )
    with pytest.raises(ScorerError, match="scorer 'model_graded' is model_graded and needs a"):
        await scorer.score(sample("t"), "o")


async def test_model_graded_custom_instructions_pattern_and_failures() -> None:
    spec = ModelGradedSpec(
        name="judge",
        rubric="r",
        instructions="Reply VERDICT=C or VERDICT=I.",
        grade_pattern=r"VERDICT=(\w)",
    )
    scorer = build_scorer(spec, base_dir=HERE)
    assert isinstance(scorer, ModelGradedScorer)
    prompt = scorer.prompt(sample(["a", "b"]), "out")
    assert prompt.endswith("Reply VERDICT=C or VERDICT=I.")
    assert "[Target answer]\na | b\n" in prompt
    assert "[Target answer]\n(none given)\n" in scorer.prompt(sample(), "out")

    async def grade(prompt: str) -> str:
        return "VERDICT=C"

    assert (await scorer.score(sample(), "o", grade=grade)).value == 1.0

    async def broken(prompt: str) -> str:
        raise TimeoutError("grader slow")

    with pytest.raises(ScorerError, match="scorer 'judge': the grader failed on sample 's1'"):
        await scorer.score(sample(), "o", grade=broken)


def test_grader_of() -> None:
    assert grader_of(ModelGradedSpec(rubric="r", grader="judge")) == "judge"
    assert grader_of(ModelGradedSpec(rubric="r")) is None
    assert grader_of(ExactSpec()) is None
    assert needs_grader(ModelGradedSpec(rubric="r")) and not needs_grader(ExactSpec())


# -- reducers -------------------------------------------------------------------------------


def test_reducers() -> None:
    values = [0.0, 1.0, 0.5, 1.0, 0.25]
    assert reduce_scores("mean", values) == pytest.approx(0.55)
    assert reduce_scores("max", values) == 1.0
    assert reduce_scores("min", values) == 0.0
    assert reduce_scores("median", values) == 0.5
    assert reduce_scores("median", [0.0, 1.0]) == 0.5
    assert reduce_scores("mode", values) == 1.0
    assert reduce_scores("mode", [0.0, 0.0, 1.0]) == 0.0
    assert reduce_scores("mode", [0.0, 1.0, 0.5]) == 1.0  # a tie goes to the larger


def test_pass_at_k() -> None:
    five = [1.0, 0.0, 1.0, 0.0, 0.0]  # n=5, c=2
    assert reduce_scores("pass@1", five) == pytest.approx(0.4)
    assert reduce_scores("pass@2", five) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2)
    assert reduce_scores("pass@3", five) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3)
    assert reduce_scores("pass@4", five) == 1.0  # fewer than 4 failures
    assert reduce_scores("pass@1", [0.0, 0.99]) == 0.0  # only a full score passes
    assert reduce_scores("pass@2", [1.0, 1.0]) == 1.0
    with pytest.raises(ValueError, match="pass@3 needs at least 3 values, got 2"):
        reduce_scores("pass@3", [1.0, 0.0])


def test_reducer_errors() -> None:
    with pytest.raises(ValueError, match="expected one of mean"):
        reduce_scores("avg", [1.0])
    with pytest.raises(ValueError, match="needs at least one value"):
        reduce_scores("mean", [])


def test_a_scorer_file_is_imported_once(tmp_path: Path) -> None:
    # The same file imported twice is one module (a file path names it).
    (tmp_path / "s.py").write_text(
        textwrap.dedent("COUNT = []\nCOUNT.append(1)\ndef f(sample, output):\n    return True\n"),
        encoding="utf-8",
    )
    first = build_scorer(PythonSpec(function="s.py:f"), base_dir=tmp_path)
    second = build_scorer(PythonSpec(function="s.py:f"), base_dir=tmp_path)
    assert first.function is second.function  # type: ignore[attr-defined]
