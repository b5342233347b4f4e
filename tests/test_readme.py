"""The README: short, its links and the docs' links resolve, and its first-run block works.

The first-run block (the one ``sh`` block under the heading holding "First run") is run
verbatim under ``bash -e`` from the repository root against a live relay (gunicorn and a
Celery worker, tests/live.py), as a newcomer pastes it: it calls ``.venv/bin/relay``, which
is where the Quickstart (and .ci/run) installs the CLI, with the live relay's environment
so the CLI writes to the same database.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_LINES = 250
FIRST_RUN = "first run"  # in the heading of the block's section, any case
BLOCK_TIMEOUT = 180  # seconds for one run of the block (it takes a few on a quiet machine)
CLI = ROOT / ".venv" / "bin" / "relay"  # what the block calls, verbatim

FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"`+[^`\n]*`+")
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:, ...


def _lines_outside_code(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of every line outside fenced code blocks."""
    kept, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and match and match.group(1).startswith(fence) and not match.group(2).strip():
            fence = None
        elif fence is None:
            kept.append((number, line))
    return kept


def _links(path: Path) -> list[tuple[int, str]]:
    """``(line number, target)`` of every Markdown link and image in ``path``, outside code."""
    found = []
    for number, line in _lines_outside_code(path.read_text()):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            found.append((number, match.group(1)))
    return found


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings, with GitHub's ``-1``, ``-2`` ... for repeats."""
    anchors: set[str] = set()
    for _, line in _lines_outside_code(path.read_text()):
        match = HEADING.match(line)
        if match:
            slug = base = _slug(match.group(2))
            n = 0
            while slug in anchors:
                n += 1
                slug = f"{base}-{n}"
            anchors.add(slug)
    return anchors


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), ROOT / "bench" / "results" / "HISTORY.md"]


def _broken_links(path: Path) -> list[str]:
    broken = []
    for number, target in _links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not resolved.exists():
            broken.append(
                f"{where} (no file {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved})"
            )
        elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
            broken.append(f"{where} (no heading with anchor #{fragment} in {resolved.relative_to(ROOT)})")
    return broken


def first_run_block(text: str) -> str:
    """The one ```` ```sh ```` block of the README section whose heading holds "First run"."""
    lines = text.splitlines()
    headings = [
        (number, line)
        for number, line in _lines_outside_code(text)
        if HEADING.match(line) and FIRST_RUN in line.lower()
    ]
    if len(headings) != 1:
        pytest.fail(f"the README needs exactly one heading holding {FIRST_RUN!r}, found {len(headings)}: {headings}")
    start, heading = headings[0]
    level = len(HEADING.match(heading).group(1))
    blocks, current, fence = [], None, None
    for line in lines[start:]:  # the lines after the heading, up to the next heading of its level or above
        match = FENCE.match(line)
        if fence is None:
            head = HEADING.match(line)
            if head and len(head.group(1)) <= level:
                break
            if match:
                fence = match.group(1)
                current = [] if match.group(2).strip() == "sh" else None
        elif match and match.group(1).startswith(fence) and not match.group(2).strip():
            if current is not None:
                blocks.append("\n".join(current) + "\n")
            fence = current = None
        elif current is not None:
            current.append(line)
    if len(blocks) != 1:
        pytest.fail(f"the README's section {heading!r} needs exactly one ```sh block, found {len(blocks)}")
    return blocks[0]


# --------------------------------------------------------------------------- the shape of the README


def test_the_readme_is_at_most_250_lines():
    count = len(README.read_text().splitlines())
    assert count <= MAX_LINES, f"README.md has {count} lines, more than {MAX_LINES}: move the reference into docs/"


def test_every_file_in_docs_is_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in _links(README) if not EXTERNAL.match(target)}
    files = sorted(p for p in DOCS.iterdir() if p.is_file() and not p.name.startswith("."))
    missing = [str(p.relative_to(ROOT)) for p in files if p.resolve() not in linked]
    assert not missing, f"files in docs/ that README.md does not link: {missing}"
    assert (ROOT / "ARCHITECTURE.md").resolve() in linked, "README.md does not link ARCHITECTURE.md"


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(path):
    broken = _broken_links(path)
    assert not broken, "broken relative links:\n" + "\n".join(broken)


def test_the_first_run_block_is_found_alone():
    block = first_run_block(README.read_text())
    assert "RELAY_URL" in block and ".venv/bin/relay" in block


def test_a_second_sh_block_under_first_run_is_refused():
    text = "# R\n\n## First run\n\n```sh\necho a\n```\n\n```sh\necho b\n```\n\n## Next\n\n```sh\necho c\n```\n"
    with pytest.raises(pytest.fail.Exception, match="exactly one ```sh block, found 2"):
        first_run_block(text)
    assert first_run_block(text.replace("```sh\necho b\n```\n", "")) == "echo a\n"
    with pytest.raises(pytest.fail.Exception, match="exactly one heading"):
        first_run_block(text.replace("First run", "Later"))


# --------------------------------------------------------------------------- the first-run block, live


def _run_block(block: str, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        ["bash", "-e", "-c", block],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its curl and python3 children go with it on a timeout
    )
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the first-run block did not end within {BLOCK_TIMEOUT} s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_first_run_block_runs_verbatim_against_a_live_relay(relay_url, base_env, tmp_path, settled):
    for tool in ("bash", "curl", "python3"):
        assert shutil.which(tool, path=base_env.get("PATH")), f"the README's first-run block needs {tool} on the PATH"
    assert CLI.exists(), (
        f"the README's first-run block calls {CLI.relative_to(ROOT)}: create the venv at the repository root "
        "as the Quickstart (and .ci/run) does"
    )
    block = first_run_block(README.read_text())
    env = dict(getattr(getattr(relay_url, "stack", None), "env", None) or base_env)
    env.update({"RELAY_URL": str(relay_url), "RELAY_HOME": str(tmp_path / "relay-home")})
    for run in (1, 2):  # twice against one relay: its handles and keys are fresh each run
        proc = _run_block(block, env)
        assert proc.returncode == 0, (
            f"run {run}: the first-run block exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        hits = [line for line in proc.stdout.splitlines() if line.startswith("search hit: ")]
        assert len(hits) == 1, f"run {run}: expected one 'search hit: ' line in\n{proc.stdout}"
        hit = json.loads(hits[0].removeprefix("search hit: "))
        assert "users" in hit["body"].lower(), hit  # the block searches q=users
        assert {"id", "task_id", "from", "caller", "target", "task_state"} <= hit.keys(), hit
        assert hit["task_state"] == "completed", hit


def test_a_search_miss_in_the_first_run_block_fails_without_closing_the_shell(relay_url, tmp_path, settled):
    """Pasted into a terminal, the block must never ``exit`` it; a miss still ends in a failed status.

    The block runs with its search term swapped for one no message holds, so it misses.
    """
    search = '--data-urlencode "q=users"'
    block = first_run_block(README.read_text())
    assert block.count(search) == 1, "the block's search call changed: update this test"
    block = block.replace(search, '--data-urlencode "q=zzyzxnothing"')
    env = {**relay_url.stack.env, "RELAY_URL": str(relay_url), "RELAY_HOME": str(tmp_path / "relay-home")}
    proc = subprocess.run(
        # No -e: a pasted block runs in an interactive shell, which goes on to the next line.
        ["bash", "-c", block + 'echo "after the block: status $?"\n'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
    )
    assert "no search hit for q=users" in proc.stderr, proc.stderr
    assert proc.stdout.splitlines()[-1] == "after the block: status 1", proc.stdout[-2000:]
    assert not any(line.startswith("search hit: ") for line in proc.stdout.splitlines()), proc.stdout
