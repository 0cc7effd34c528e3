"""Finding a persona's skills, and noticing when they change.

A persona sees the skills of two folders: its own ``<persona>/skills/<name>/``
and the home's ``<home>/skills/<name>/`` (shared by every persona). A
persona's skill overrides a global one of the same name — the folder takes
the name, valid or not. ``skills: [...]`` in persona.yaml narrows what it
sees to those names, in that order; a name there that no folder holds is a
problem naming it.

A skill that cannot be used (a bad front matter, no ``SKILL.md``, a name
``skills:`` lists that does not exist) is a :class:`SkillProblem`: it is
left out of what the persona may load, never silently — the persona's
prompt names it, ``load_skill`` of its name answers why, and the turn that
first sees it logs it and records it in the audit log
(:mod:`~coterie.runtime.skills.listing`). A bad skill never stops a
persona: skills change while personas run, and one wrong file must not take
every persona of the home down.

Skill files are edited while a persona runs. :meth:`SkillCatalog.changed`
tells cheaply whether anything may have changed — a ``stat`` of both skills
folders (their modification time moves when a skill folder is added,
removed or renamed) and of each ``SKILL.md`` — without listing a folder or
reading a file; only then does :meth:`SkillCatalog.scan` list the folders
again, and it reads again only the files whose stamp moved.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coterie.runtime.skills.format import (
    MAX_SKILL_FILE_BYTES,
    SKILL_FILE,
    Skill,
    SkillFormatError,
    SkillScope,
    parse_skill,
)

#: Skill folders read from one skills folder; the rest are one problem.
MAX_SKILLS_PER_FOLDER = 500

#: What a file's stamp is made of: modification and change times, size and
#: inode (an editor that writes a new file and renames it changes the inode
#: even within one tick of the clock); None when the file is not there.
Stamp = tuple[int, int, int, int] | None


def _stamp(path: str) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


@dataclass(frozen=True)
class SkillProblem:
    """A skill the persona should see and cannot use, and why."""

    #: The skill's name (its folder's, or the one ``skills:`` lists).
    name: str
    #: The file at fault (a ``SKILL.md``, or persona.yaml for ``skills:``).
    path: str
    #: What is wrong, field by field (``name: …; description: …``).
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


@dataclass(frozen=True)
class SkillSet:
    """What skills one persona sees at one moment (an immutable snapshot).

    ``skills`` are in the persona's order of priority (the one of
    ``skills:`` in persona.yaml, else its own skills then the global ones,
    each by name); ``read_roots`` are the real folders of its global skills,
    which its file tools may read (never write).
    """

    skills: tuple[Skill, ...] = ()
    problems: tuple[SkillProblem, ...] = ()
    read_roots: tuple[Path, ...] = ()
    _by_name: Mapping[str, Skill] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {s.name: s for s in self.skills})

    def __bool__(self) -> bool:
        return bool(self.skills or self.problems)

    def get(self, name: str) -> Skill | None:
        """The usable skill of that name."""
        return self._by_name.get(name)

    def problem(self, name: str) -> SkillProblem | None:
        """Why the skill of that name cannot be used, if it cannot."""
        return next((p for p in self.problems if p.name == name), None)

    def names(self) -> list[str]:
        return [s.name for s in self.skills]


class SkillCatalog:
    """The skills one persona sees, kept up to date with their files."""

    def __init__(
        self,
        *,
        home: Path,
        persona_dir: Path,
        only: Sequence[str] | None = None,
        max_per_folder: int = MAX_SKILLS_PER_FOLDER,
    ) -> None:
        """``only``: persona.yaml's ``skills:`` (None: every skill)."""
        self.home = home
        self.persona_dir = persona_dir
        self.only = tuple(only) if only is not None else None
        self.max_per_folder = max_per_folder
        # The persona's own folder first: its skills override the global ones.
        self.folders: tuple[tuple[Path, SkillScope], ...] = (
            (persona_dir / "skills", "persona"),
            (home / "skills", "global"),
        )
        self._watched: dict[str, Stamp] = {}
        self._parsed: dict[str, tuple[Stamp, Skill | SkillProblem]] = {}
        self._current = SkillSet()
        self._scanned = False
        self._lock = asyncio.Lock()

    @property
    def current(self) -> SkillSet:
        """The snapshot of the last scan (empty before the first)."""
        return self._current

    def changed(self) -> bool:
        """Whether a skill may have changed since the last scan: a few stats
        (both folders, each watched ``SKILL.md``), no listing, no reading."""
        if not self._scanned:
            return True
        return any(_stamp(path) != stamp for path, stamp in self._watched.items())

    async def refresh(self) -> SkillSet:
        """The current skills, scanned again (in a thread) only if something changed."""
        # The stats run on the event loop: a few microseconds each, less than
        # one hop to a thread; the listing and reading of a scan go to one.
        if not self.changed():
            return self._current
        async with self._lock:
            if self.changed():
                await asyncio.to_thread(self.scan)
        return self._current

    def scan(self) -> SkillSet:
        """List both folders, read the ``SKILL.md`` files whose stamp moved,
        and make the new snapshot (the old object when nothing differs)."""
        watched: dict[str, Stamp] = {}
        found: dict[str, tuple[Path, SkillScope]] = {}
        problems: list[SkillProblem] = []
        for folder, scope in self.folders:
            watched[str(folder)] = _stamp(str(folder))
            for entry in self._entries(folder, problems):
                if entry.name in found or (self.only is not None and entry.name not in self.only):
                    continue
                found[entry.name] = (Path(entry.path), scope)
                skill_file = os.path.join(entry.path, SKILL_FILE)
                watched[skill_file] = _stamp(skill_file)
        parsed: dict[str, tuple[Stamp, Skill | SkillProblem]] = {}
        results: dict[str, Skill | SkillProblem] = {}
        for name, (folder, scope) in found.items():
            skill_file = str(folder / SKILL_FILE)
            stamp = watched[skill_file]
            cached = self._parsed.get(skill_file)
            if cached is not None and cached[0] == stamp and stamp is not None:
                result = cached[1]
            else:
                result = self._read(folder / SKILL_FILE, name, scope)
            parsed[skill_file] = (stamp, result)
            results[name] = result
        snapshot = self._snapshot(results, problems)
        self._parsed = parsed
        self._watched = watched
        self._scanned = True
        if snapshot != self._current:
            self._current = snapshot
        return self._current

    def _entries(self, folder: Path, problems: list[SkillProblem]) -> list[os.DirEntry[str]]:
        """The skill folders of ``folder`` by name (hidden ones skipped), at
        most ``max_per_folder`` of them."""
        try:
            with os.scandir(folder) as it:
                entries = sorted(
                    (e for e in it if not e.name.startswith(".") and e.is_dir()),
                    key=lambda e: e.name,
                )
        except OSError:  # no such folder, or not one
            return []
        if len(entries) > self.max_per_folder:
            extra = entries[self.max_per_folder :]
            problems.append(
                SkillProblem(
                    name=extra[0].name,
                    path=str(folder),
                    detail=f"{len(entries)} skill folders; only the first "
                    f"{self.max_per_folder} by name are read (left out: "
                    f"{', '.join(e.name for e in extra[:10])}{', …' if len(extra) > 10 else ''})",
                )
            )
            entries = entries[: self.max_per_folder]
        return entries

    @staticmethod
    def _read(path: Path, name: str, scope: SkillScope) -> Skill | SkillProblem:
        try:
            with path.open("rb") as f:
                # One byte past the cap is enough to refuse a file as too large.
                data = f.read(MAX_SKILL_FILE_BYTES + 1)
        except FileNotFoundError:
            return SkillProblem(
                name, str(path), f"no {SKILL_FILE} in the folder (the file must be named so)"
            )
        except OSError as exc:
            return SkillProblem(name, str(path), f"(file): cannot read: {exc.strerror}")
        try:
            return parse_skill(path, data, scope=scope)
        except SkillFormatError as exc:
            return SkillProblem(name, exc.path, "; ".join(exc.problems))

    def _snapshot(
        self, results: dict[str, Skill | SkillProblem], problems: list[SkillProblem]
    ) -> SkillSet:
        if self.only is not None:
            order = list(self.only)
        else:
            order = sorted(results, key=lambda n: (_scope_rank(results[n]), n))
        skills: list[Skill] = []
        for name in order:
            result = results.get(name)
            if result is None:
                problems.append(
                    SkillProblem(
                        name,
                        str(self.persona_dir / "persona.yaml"),
                        f"skills: names {name!r}, which no folder holds (looked in "
                        f"{self.folders[0][0]} and {self.folders[1][0]})",
                    )
                )
            elif isinstance(result, SkillProblem):
                problems.append(result)
            else:
                skills.append(result)
        usable, roots = self._read_roots(skills, problems)
        return SkillSet(skills=tuple(usable), problems=tuple(problems), read_roots=roots)

    def _read_roots(
        self, skills: list[Skill], problems: list[SkillProblem]
    ) -> tuple[list[Skill], tuple[Path, ...]]:
        """The real folders of the global skills (the file tools may read
        them); a global skill whose folder resolves to the home or above it
        would open the whole home, so it is a problem instead."""
        home = self.home.resolve()
        usable: list[Skill] = []
        roots: list[Path] = []
        for skill in skills:
            if skill.scope == "global":
                real = skill.folder.resolve()
                if home == real or home.is_relative_to(real):
                    problems.append(
                        SkillProblem(
                            skill.name,
                            str(skill.path),
                            f"(folder): resolves to {real}, which holds the home {home}",
                        )
                    )
                    continue
                roots.append(real)
            usable.append(skill)
        return usable, tuple(roots)


def _scope_rank(result: Skill | SkillProblem) -> int:
    if isinstance(result, Skill):
        return 0 if result.scope == "persona" else 1
    return 2


__all__ = ["MAX_SKILLS_PER_FOLDER", "SkillCatalog", "SkillProblem", "SkillSet", "Stamp"]
