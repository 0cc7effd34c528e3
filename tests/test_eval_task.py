"""Eval task files (runtime.eval.task): loading, validation errors, datasets."""

from __future__ import annotations

import json
import pickle
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from coterie.runtime.errors import ConfigError
from coterie.runtime.eval.dataset import load_samples
from coterie.runtime.eval.task import (
    DatasetSpec,
    EvalTask,
    ExactSpec,
    ModelGradedSpec,
    NumericSpec,
    RegexSpec,
    Sample,
    SampleLimits,
    SolverSpec,
    TaskFileError,
    load_task,
    parse_reducer,
)
from tests.helpers import no_plugin_providers

FULL_TASK = """\
name: arith.v1-demo
description: small sums
dataset:
  path: data/sums.jsonl
  fields: {input: question, target: answer, id: qid}
solver:
  persona: mathbot
  model: {provider: openai, name: gpt-4.1-mini}
scorers:
  - type: exact
  - type: includes
    ignore_case: false
  - type: regex
    name: final
    pattern: "ANSWER: (?P<ans>\\\\d+)"
    group: ans
  - type: numeric
    tolerance: 0.5
    relative: true
  - type: choice
  - type: python
    function: checks.py:check
  - type: model_graded
    grader: judge
    rubric: the sum is right
epochs: 3
reducers: [mean, pass@3, mode]
limits: {time_s: 30, model_calls: 5, tokens: 1000, tool_calls: 0}
retries: 1
max_samples: 4
max_connections: 2
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def task_file(tmp_path: Path, **overrides: object) -> Path:
    """A minimal valid task with some top-level keys replaced (None drops one)."""
    raw: dict[str, object] = {
        "name": "t",
        "dataset": {"path": "d.jsonl"},
        "solver": {"persona": "p"},
        "scorers": [{"type": "exact"}],
    }
    for key, value in overrides.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(TaskFileError) as info:
        load_task(path)
    assert info.value.path == str(path)
    assert str(info.value).startswith(f"invalid eval task {path}:\n  - ")
    return info.value.problems


# -- load_task: the happy path -------------------------------------------------------------


def test_a_full_task_loads_and_round_trips(tmp_path: Path) -> None:
    path = write(tmp_path / "evals" / "arith.yaml", FULL_TASK)
    task = load_task(path)
    assert task.name == "arith.v1-demo"
    assert task.base_dir == path.resolve().parent
    assert task.source == path
    assert task.label == str(path)
    assert task.dataset.resolved_format == "jsonl"
    assert task.dataset.fields == {"input": "question", "target": "answer", "id": "qid"}
    assert task.solver == SolverSpec(
        persona="mathbot", model={"provider": "openai", "name": "gpt-4.1-mini"}
    )
    assert [s.type for s in task.scorers] == [
        "exact",
        "includes",
        "regex",
        "numeric",
        "choice",
        "python",
        "model_graded",
    ]
    regex = task.scorers[2]
    assert isinstance(regex, RegexSpec) and regex.group == "ans" and regex.name == "final"
    assert task.scorers[3] == NumericSpec(tolerance=0.5, relative=True)
    graded = task.scorers[6]
    assert isinstance(graded, ModelGradedSpec)
    assert graded.grader == "judge" and graded.grade_pattern == r"GRADE:\s*([CPI])"
    assert task.epochs == 3 and task.reducers == ["mean", "pass@3", "mode"]
    assert task.limits == SampleLimits(time_s=30, model_calls=5, tokens=1000, tool_calls=0)
    assert (task.retries, task.max_samples, task.max_connections) == (1, 4, 2)

    dumped = task.model_dump()
    assert "base_dir" not in dumped
    again_path = write(tmp_path / "again" / "task.yaml", yaml.safe_dump(dumped))
    again = load_task(again_path)
    assert again.model_dump() == dumped
    assert EvalTask.model_validate_json(task.model_dump_json()).model_dump() == dumped


def test_defaults_of_a_minimal_task(tmp_path: Path) -> None:
    task = load_task(task_file(tmp_path))
    assert task.epochs == 1 and task.reducers == ["mean"]
    assert task.limits == SampleLimits()
    assert (task.retries, task.max_samples, task.max_connections) == (2, 16, 8)
    assert task.scorers == [ExactSpec(ignore_case=True, strip=True)]


def test_a_task_can_be_built_in_python() -> None:
    task = EvalTask(
        name="py",
        dataset=DatasetSpec(function="mymod:rows"),
        solver=SolverSpec(inline={"model": {"provider": "scripted"}, "soul": "Be brief."}),
        scorers=[ExactSpec(), NumericSpec(name="num", tolerance=1)],
        epochs=2,
        reducers=["pass@2"],
    )
    assert task.base_dir == Path(".")
    assert task.source is None and task.label == "<task py>"
    assert [s.type for s in task.scorers] == ["exact", "numeric"]


def test_parse_reducer() -> None:
    assert parse_reducer("mean") == ("mean", None)
    assert parse_reducer("pass@3") == ("pass", 3)
    for bad in ("pass@0", "pass@", "pass@x", "avg", "Mean"):
        with pytest.raises(ValueError, match="expected one of mean, max, min, mode, median"):
            parse_reducer(bad)


def test_task_file_error_is_a_config_error_and_pickles() -> None:
    err = TaskFileError("t.yaml", ["name: bad"])
    assert isinstance(err, ConfigError)
    back = pickle.loads(pickle.dumps(err))
    assert (back.path, back.problems, str(back)) == ("t.yaml", ["name: bad"], str(err))


# -- load_task: every problem names the file, the field and what was expected --------------


def test_missing_file(tmp_path: Path) -> None:
    assert problems_of(tmp_path / "nope.yaml") == ["file not found"]


def test_not_yaml(tmp_path: Path) -> None:
    path = write(tmp_path / "t.yaml", "name: [unclosed\n")
    [problem] = problems_of(path)
    assert problem.startswith("not valid YAML:")


def test_not_a_mapping(tmp_path: Path) -> None:
    assert problems_of(write(tmp_path / "t.yaml", "- a\n- b\n")) == [
        "(top level): expected a mapping, got list"
    ]
    assert problems_of(write(tmp_path / "t.yaml", "")) == [
        "(top level): expected a mapping, got an empty file"
    ]


def test_unknown_scorer_type_lists_the_valid_ones(tmp_path: Path) -> None:
    path = task_file(tmp_path, scorers=[{"type": "exact"}, {"type": "fuzzy"}])
    assert problems_of(path) == [
        "scorers.1: unknown scorer type 'fuzzy'; expected one of exact, includes, regex, "
        "numeric, choice, python, plugin, model_graded"
    ]
    path = task_file(tmp_path, scorers=[{"pattern": "x"}])
    assert problems_of(path) == [
        "scorers.0: missing 'type'; expected one of exact, includes, regex, numeric, choice, "
        "python, plugin, model_graded"
    ]


def test_scorer_field_errors_drop_the_type_from_the_path(tmp_path: Path) -> None:
    path = task_file(
        tmp_path,
        scorers=[{"type": "exact"}, {"type": "numeric", "tolerance": -1, "colour": "red"}],
    )
    assert problems_of(path) == [
        "scorers.1.tolerance: Input should be greater than or equal to 0, got -1",
        "scorers.1.colour: unknown field",
    ]


def test_bad_regex(tmp_path: Path) -> None:
    path = task_file(tmp_path, scorers=[{"type": "regex", "pattern": "(ab"}])
    [problem] = problems_of(path)
    assert problem.startswith("scorers.0.pattern: expected a regular expression, got '(ab' (")
    assert "missing )" in problem


def test_regex_group_must_exist(tmp_path: Path) -> None:
    path = task_file(tmp_path, scorers=[{"type": "regex", "pattern": "a(b)", "group": 2}])
    assert problems_of(path) == ["scorers.0: group: the pattern has 1 group(s), got 2"]
    path = task_file(tmp_path, scorers=[{"type": "regex", "pattern": "a(b)", "group": "x"}])
    assert problems_of(path) == ["scorers.0: group: no group named 'x' (named groups: none)"]
    # A digit string is the group's number.
    spec = RegexSpec(pattern="a(b)", group="1")
    assert spec.group == 1


def test_grade_pattern_needs_a_group(tmp_path: Path) -> None:
    scorer = {"type": "model_graded", "rubric": "r", "grade_pattern": "GRADE: C"}
    [problem] = problems_of(task_file(tmp_path, scorers=[scorer]))
    assert problem.startswith("scorers.0.grade_pattern: expected a pattern with a group")


def test_python_function_reference_is_checked(tmp_path: Path) -> None:
    path = task_file(tmp_path, scorers=[{"type": "python", "function": "no_colon"}])
    assert problems_of(path) == [
        "scorers.0.function: expected 'package.module:func' or 'file.py:func', got 'no_colon'"
    ]


def test_duplicate_scorer_names(tmp_path: Path) -> None:
    path = task_file(tmp_path, scorers=[{"type": "exact"}, {"type": "includes", "name": "exact"}])
    assert problems_of(path) == [
        "scorers: scorers 0 and 1 are both named 'exact'; expected unique names (set 'name:')"
    ]


def test_no_scorers(tmp_path: Path) -> None:
    [problem] = problems_of(task_file(tmp_path, scorers=[]))
    assert problem.startswith("scorers: List should have at least 1 item")


def test_pass_at_k_above_epochs(tmp_path: Path) -> None:
    path = task_file(tmp_path, epochs=2, reducers=["mean", "pass@3"])
    assert problems_of(path) == ["reducers: pass@3: expected K <= epochs (2), got 3"]
    path = task_file(tmp_path, reducers=["average"])
    assert problems_of(path) == [
        "reducers: expected one of mean, max, min, mode, median, pass@K (K >= 1), got 'average'"
    ]


def test_solver_needs_exactly_one_of_persona_or_inline(tmp_path: Path) -> None:
    both = {"persona": "p", "inline": {"model": {"provider": "scripted"}}}
    assert problems_of(task_file(tmp_path, solver=both)) == [
        "solver: expected exactly one of 'persona' or 'inline', found both"
    ]
    neither = {"model": {"provider": "scripted"}}
    assert problems_of(task_file(tmp_path, solver=neither)) == [
        "solver: expected exactly one of 'persona' or 'inline', found neither"
    ]


def test_solver_persona_and_inline_bodies_are_validated(tmp_path: Path) -> None:
    path = task_file(tmp_path, solver={"persona": "Not A Name"})
    assert problems_of(path) == [
        "solver.persona: expected a persona name (lowercase letters, digits, - or _), "
        "got 'Not A Name'"
    ]
    inline = {"model": {"provider": "openai"}, "tools": {"allow": 3}, "soul": 5}
    assert problems_of(task_file(tmp_path, solver={"inline": inline})) == [
        "solver.inline: model.name: required field missing; "
        "tools.allow: Input should be a valid list, got 3; soul: expected a string, got int"
    ]
    model = {"provider": "Gemini Pro"}
    assert problems_of(task_file(tmp_path, solver={"persona": "p", "model": model})) == [
        "solver.model: provider: expected one of scripted, openai, anthropic, the name of a "
        "provider a loaded plugin registers (loaded: none) or 'module:Class', got 'Gemini Pro'"
    ]
    graded = {"type": "model_graded", "rubric": "r", "grader": "The Judge"}
    assert problems_of(task_file(tmp_path, scorers=[graded])) == [
        "scorers.0.grader: expected a persona name (lowercase letters, digits, - or _), "
        "got 'The Judge'"
    ]
    # An inline persona may take its model from the override.
    solver = SolverSpec(inline={"tools": {"allow": ["clock"]}}, model={"provider": "scripted"})
    assert solver.inline == {"tools": {"allow": ["clock"]}}


def test_dataset_needs_exactly_one_of_path_or_function(tmp_path: Path) -> None:
    path = task_file(tmp_path, dataset={"path": "d.jsonl", "function": "m:f"})
    assert problems_of(path) == [
        "dataset: expected exactly one of 'path', 'function' or 'loader', found path and function"
    ]
    assert problems_of(task_file(tmp_path, dataset={})) == [
        "dataset: expected exactly one of 'path', 'function' or 'loader', found none"
    ]


def test_dataset_format_and_fields(tmp_path: Path) -> None:
    path = task_file(tmp_path, dataset={"path": "d.txt"})
    assert problems_of(path) == [
        "dataset: cannot tell the format of 'd.txt' from its suffix; expected .jsonl, .json or "
        ".csv, or set 'format: jsonl' or 'format: csv'"
    ]
    assert load_task(task_file(tmp_path, dataset={"path": "d.txt", "format": "csv"}))
    path = task_file(tmp_path, dataset={"path": "d.csv", "format": "xml"})
    assert problems_of(path) == ["dataset.format: Input should be 'jsonl' or 'csv', got 'xml'"]
    path = task_file(tmp_path, dataset={"path": "d.csv", "fields": {"question": "q"}})
    assert problems_of(path) == [
        "dataset.fields: expected keys among id, input, target, metadata, got ['question']"
    ]


def test_top_level_fields(tmp_path: Path) -> None:
    path = task_file(tmp_path, name="has space", epochs=0, limits={"time_s": 0}, extra=1)
    assert problems_of(path) == [
        "name: expected letters, digits, '_', '.' or '-' only, got 'has space'",
        "epochs: Input should be greater than or equal to 1, got 0",
        "limits.time_s: Input should be greater than 0, got 0",
        "extra: unknown field",
    ]
    assert problems_of(task_file(tmp_path, solver=None)) == ["solver: required field missing"]
    assert problems_of(task_file(tmp_path, name="t\n")) == [
        "name: expected letters, digits, '_', '.' or '-' only, got 't\\n'"
    ]
    # An invalid epochs is reported once, not again as a pass@K above it.
    assert problems_of(task_file(tmp_path, epochs=500, reducers=["pass@3"])) == [
        "epochs: Input should be less than or equal to 100, got 500"
    ]
    path = task_file(tmp_path, base_dir="/elsewhere")
    assert problems_of(path) == ["base_dir: unknown field (it is the task file's folder)"]


# -- load_samples ---------------------------------------------------------------------------


def jsonl_task(tmp_path: Path, rows: list[object] | str, **dataset: object) -> EvalTask:
    lines = rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "data.jsonl").write_text(lines, encoding="utf-8")
    spec = {"path": "data.jsonl", **dataset}
    return load_task(task_file(tmp_path, dataset=spec))


def sample_problems(task: EvalTask, dataset: Path) -> list[str]:
    with pytest.raises(TaskFileError) as info:
        load_samples(task)
    assert info.value.path == str(dataset)
    assert str(dataset) in str(info.value)
    return info.value.problems


def test_jsonl_samples(tmp_path: Path) -> None:
    rows = [
        {"input": "1+1?", "target": 2, "topic": "sums"},
        {"id": "b", "input": "Capital of France?", "target": ["Paris", "paris"]},
        {"id": 7, "input": "x", "metadata": {"level": 3}, "lang": "en"},
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows[:2]) + "\n  \n" + json.dumps(rows[2])
    samples = load_samples(jsonl_task(tmp_path, text))
    assert samples == [
        Sample(id="1", input="1+1?", target="2", metadata={"topic": "sums"}),
        Sample(id="b", input="Capital of France?", target=["Paris", "paris"]),
        Sample(id="7", input="x", target="", metadata={"lang": "en", "level": 3}),
    ]
    assert samples[0].targets == ["2"] and samples[2].targets == []
    assert load_samples(jsonl_task(tmp_path, text), limit=2) == samples[:2]


def test_jsonl_fields_are_renamed(tmp_path: Path) -> None:
    fields = {"input": "question", "target": "answer", "id": "qid", "metadata": "meta"}
    rows = [{"qid": "q1", "question": "2*3?", "answer": 6.5, "meta": {"a": 1}, "input": "kept"}]
    [sample] = load_samples(jsonl_task(tmp_path, rows, fields=fields))
    assert sample == Sample(id="q1", input="2*3?", target="6.5", metadata={"input": "kept", "a": 1})


def test_bad_jsonl_line_is_named(tmp_path: Path) -> None:
    task = jsonl_task(tmp_path, '{"input": "a"}\n\n{"input": "b",}\n')
    [problem] = sample_problems(task, tmp_path / "data.jsonl")
    assert problem.startswith("line 3: expected a JSON object, found invalid JSON (")
    task = jsonl_task(tmp_path, '{"input": "a"}\n[1, 2]\n')
    assert sample_problems(task, tmp_path / "data.jsonl") == [
        "line 2: expected a JSON object, got list"
    ]


def test_bad_jsonl_fields_are_named(tmp_path: Path) -> None:
    rows: list[object] = [{"input": "a"}, {"question": "b", "target": {"x": 1}, "id": ""}]
    assert sample_problems(jsonl_task(tmp_path, rows), tmp_path / "data.jsonl") == [
        "line 2: input: missing; expected a string",
        "line 2: target: expected a string, a number or a list of them, got {'x': 1}",
        "line 2: id: expected a non-empty string or an integer, got ''",
    ]
    rows = [{"q": 3}]
    task = jsonl_task(tmp_path, rows, fields={"input": "q"})
    assert sample_problems(task, tmp_path / "data.jsonl") == [
        "line 1: input (column 'q'): expected a non-empty string, got 3"
    ]
    rows = [{"input": "a", "metadata": [1]}]
    assert sample_problems(jsonl_task(tmp_path, rows), tmp_path / "data.jsonl") == [
        "line 1: metadata: expected a JSON object, got [1]"
    ]


def test_duplicate_ids_name_both_rows(tmp_path: Path) -> None:
    rows = [{"id": "a", "input": "x"}, {"id": "b", "input": "y"}, {"id": "a", "input": "z"}]
    assert sample_problems(jsonl_task(tmp_path, rows), tmp_path / "data.jsonl") == [
        "line 3: id 'a' is also the id of line 1; expected unique ids"
    ]
    # A default id (the row number) clashes with an explicit one too.
    rows = [{"id": "2", "input": "x"}, {"input": "y"}]
    assert sample_problems(jsonl_task(tmp_path, rows), tmp_path / "data.jsonl") == [
        "line 2: id '2' is also the id of line 1; expected unique ids"
    ]


def test_missing_and_empty_datasets(tmp_path: Path) -> None:
    task = load_task(task_file(tmp_path, dataset={"path": "gone.jsonl"}))
    assert sample_problems(task, tmp_path / "gone.jsonl") == [
        f"file not found (dataset.path of {tmp_path / 'task.yaml'})"
    ]
    task = jsonl_task(tmp_path, "\n\n")
    assert sample_problems(task, tmp_path / "data.jsonl") == [
        "expected at least one sample, found none"
    ]
    assert load_samples(task, limit=0) == []


def test_csv_samples(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text(
        "qid,question,answer,topic,metadata\n"
        'a,"Sum, please: 1+2",3,sums,"{""level"": 2}"\n'
        "b,2+2?,4,sums,\n",
        encoding="utf-8",
    )
    fields = {"input": "question", "target": "answer", "id": "qid"}
    task = load_task(task_file(tmp_path, dataset={"path": "d.csv", "fields": fields}))
    assert load_samples(task) == [
        Sample(
            id="a", input="Sum, please: 1+2", target="3", metadata={"topic": "sums", "level": 2}
        ),
        Sample(id="b", input="2+2?", target="4", metadata={"topic": "sums"}),
    ]


def test_csv_ids_default_to_the_row_number(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("input,target\nx,1\ny,2\n", encoding="utf-8")
    task = load_task(task_file(tmp_path, dataset={"path": "d.csv"}))
    assert [s.id for s in load_samples(task)] == ["1", "2"]


def test_csv_missing_input_column(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("question,target\nx,1\n", encoding="utf-8")
    task = load_task(task_file(tmp_path, dataset={"path": "d.csv"}))
    assert sample_problems(task, tmp_path / "d.csv") == [
        "input: expected a column 'input' in the header, or map it with dataset.fields.input; "
        "found columns question, target"
    ]
    task = load_task(task_file(tmp_path, dataset={"path": "d.csv", "fields": {"target": "ans"}}))
    (tmp_path / "d.csv").write_text("input,target\nx,1\n", encoding="utf-8")
    assert sample_problems(task, tmp_path / "d.csv") == [
        "target: expected a column 'ans' in the header; found columns input, target"
    ]


def test_bad_csv_rows_are_named(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("input,target\nx,1\ny,2,extra\n", encoding="utf-8")
    task = load_task(task_file(tmp_path, dataset={"path": "d.csv"}))
    assert sample_problems(task, tmp_path / "d.csv") == [
        "row 2 (line 3): expected 2 cells as in the header, found 3"
    ]
    (tmp_path / "d.csv").write_text("input,target\nx,1\n,2\n", encoding="utf-8")
    assert sample_problems(task, tmp_path / "d.csv") == [
        "row 2 (line 3): input: expected a non-empty string, got ''"
    ]
    (tmp_path / "d.csv").write_text("id,input\na,x\na,y\n", encoding="utf-8")
    assert sample_problems(task, tmp_path / "d.csv") == [
        "row 2 (line 3): id 'a' is also the id of row 1 (line 2); expected unique ids"
    ]


def test_function_dataset_from_a_file(tmp_path: Path) -> None:
    write(
        tmp_path / "rows.py",
        """\
        from coterie.runtime.eval.task import Sample

        def rows():
            yield {"q": "first", "a": 1, "tag": "x"}
            yield Sample(id="s", input="second", target=["b"])
        """,
    )
    dataset = {"function": "rows.py:rows", "fields": {"input": "q", "target": "a"}}
    task = load_task(task_file(tmp_path, dataset=dataset))
    assert load_samples(task) == [
        Sample(id="1", input="first", target="1", metadata={"tag": "x"}),
        Sample(id="s", input="second", target=["b"]),
    ]


def test_function_dataset_from_a_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "evalrows_mod.py", "def rows():\n    return [{'input': 'hi'}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = EvalTask(
        name="py",
        dataset=DatasetSpec(function="evalrows_mod:rows"),
        solver=SolverSpec(persona="p"),
        scorers=[ExactSpec()],
    )
    assert load_samples(task) == [Sample(id="1", input="hi")]


def test_function_dataset_errors(tmp_path: Path) -> None:
    write(
        tmp_path / "bad.py",
        """\
        def boom():
            raise RuntimeError("no data")

        def scalar():
            return 3

        def mixed():
            return [{"input": "a"}, "b"]

        async def later():
            return []
        """,
    )
    task_path = tmp_path / "task.yaml"

    def problems(ref: str) -> tuple[str, list[str]]:
        task = load_task(task_file(tmp_path, dataset={"function": ref}))
        with pytest.raises(TaskFileError) as info:
            load_samples(task)
        return info.value.path, info.value.problems

    label = f"(dataset.function of {task_path})"
    assert problems("bad.py:boom") == (
        f"bad.py:boom {label}",
        ["the function raised RuntimeError: no data"],
    )
    assert problems("bad.py:scalar") == (
        f"bad.py:scalar {label}",
        ["expected an iterable of dicts or Samples, got int"],
    )
    assert problems("bad.py:mixed") == (
        f"bad.py:mixed {label}",
        ["row 2: expected a dict or a Sample, got str"],
    )
    assert problems("bad.py:later") == (
        f"bad.py:later {label}",
        ["expected a function returning rows, got an async one"],
    )
    path, [problem] = problems("bad.py:missing")
    assert path == str(task_path)
    assert problem == (
        "dataset.function: cannot import 'bad.py:missing': bad.py has no attribute 'missing'"
    )
    path, [problem] = problems("nowhere.py:f")
    assert problem == (
        f"dataset.function: cannot import 'nowhere.py:f': no file {(tmp_path / 'nowhere.py')}"
    )
    path, [problem] = problems("no_such_module_xyz:f")
    assert problem.startswith("dataset.function: cannot import 'no_such_module_xyz:f': No module")


def test_function_dataset_rejects_format(tmp_path: Path) -> None:
    path = task_file(tmp_path, dataset={"function": "m:f", "format": "csv"})
    assert problems_of(path) == ["dataset: 'format' applies to 'path' only"]


@pytest.fixture(autouse=True)
def _no_plugin_providers() -> Iterator[None]:
    """Messages here name the plugin providers loaded: none, whatever ran before."""
    with no_plugin_providers():
        yield
