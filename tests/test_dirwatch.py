"""The run directory's inotify watch that wakes the events reader (tether.pi.detached._DirWatch):
what wakes it, what it says of the exit file, that nothing that happens between two waits is
lost, and that it leaves the event loop as it found it."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import anyio

from tether.pi.detached import _DirWatch
from tether.pi.keeper import EVENTS_NAME, EXIT_NAME


def _watch(run_dir: Path) -> _DirWatch:
    (run_dir / EVENTS_NAME).touch()
    watch = _DirWatch(run_dir, grows=run_dir / EVENTS_NAME)
    # Linux, where custody runs, has inotify: without it the reader polls, and these tests
    # would test nothing.
    assert watch.fd is not None, "inotify_init1 or inotify_add_watch failed"
    return watch


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def test_the_watch_says_which_change_may_be_the_exit_file(tmp_path: Path) -> None:
    async def main() -> list[bool]:
        seen = []
        with _watch(tmp_path) as watch:
            _append(tmp_path / EVENTS_NAME, b"{}\n")
            seen.append(await watch.wait(5, name=EXIT_NAME))  # the events file grew
            (tmp_path / "other.txt").write_text("x")
            seen.append(await watch.wait(5, name=EXIT_NAME))  # another file landed
            (tmp_path / "exit.tmp").write_text("{}")
            (tmp_path / "exit.tmp").rename(tmp_path / EXIT_NAME)
            seen.append(await watch.wait(5, name=EXIT_NAME))  # created, then renamed in place
            _append(tmp_path / EVENTS_NAME, b"{}\n")
            seen.append(await watch.wait(5))  # without a name: any wake-up
        return seen

    assert anyio.run(main) == [False, False, True, True]


def test_another_event_loop_waits_for_the_same_changes(tmp_path: Path) -> None:
    # anyio's other backend has no asyncio loop: each wait registers the descriptor itself.
    async def main() -> list[bool]:
        seen = []
        with _watch(tmp_path) as watch:
            _append(tmp_path / EVENTS_NAME, b"{}\n")
            seen.append(await watch._wait_readable(5, EXIT_NAME))
            (tmp_path / EXIT_NAME).write_text("{}")
            seen.append(await watch._wait_readable(5, EXIT_NAME))
            seen.append(await watch._wait_readable(0.05, EXIT_NAME))  # nothing: look anyway
        return seen

    assert anyio.run(main) == [False, True, True]


def test_a_wait_with_nothing_happening_ends_in_time_and_says_look(tmp_path: Path) -> None:
    async def main() -> tuple[bool, float]:
        with _watch(tmp_path) as watch:
            (tmp_path / "session.jsonl").touch()
            await watch.wait(0.5)  # its creation wakes the directory's watch once
            # pi's other files (its session file) grow without waking the reader
            _append(tmp_path / "session.jsonl", b"more\n")
            started = time.monotonic()
            landed = await watch.wait(0.2, name=EXIT_NAME)
            return landed, time.monotonic() - started

    landed, took = anyio.run(main)
    assert landed is True  # nothing came: the reader looks anyway
    assert 0.15 <= took < 2


def test_what_happens_between_two_waits_is_kept_for_the_next(tmp_path: Path) -> None:
    async def main() -> tuple[bool, float]:
        with _watch(tmp_path) as watch:
            _append(tmp_path / EVENTS_NAME, b"{}\n")
            await watch.wait(5)  # registered with the loop from here on
            (tmp_path / EXIT_NAME).write_text("{}")
            await anyio.sleep(0.1)  # the loop reads the event while nobody waits
            started = time.monotonic()
            landed = await watch.wait(30, name=EXIT_NAME)
            return landed, time.monotonic() - started

    landed, took = anyio.run(main)
    assert landed is True
    assert took < 1  # at once, not after the 30 s


def test_a_cancelled_wait_leaves_the_watch_usable(tmp_path: Path) -> None:
    async def main() -> tuple[bool, bool]:
        with _watch(tmp_path) as watch:
            with anyio.move_on_after(0.05) as scope:
                await watch.wait(30)
            (tmp_path / EXIT_NAME).write_text("{}")
            return scope.cancelled_caught, await watch.wait(5, name=EXIT_NAME)

    assert anyio.run(main) == (True, True)


def test_the_watch_leaves_the_event_loop_as_it_found_it(tmp_path: Path) -> None:
    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        with _watch(tmp_path) as watch:
            fd = watch.fd
            assert fd is not None
            _append(tmp_path / EVENTS_NAME, b"{}\n")
            await watch.wait(5)
            registered = loop.remove_reader(fd)
            loop.add_reader(fd, watch._readable)  # put back: the exit must remove it
        return registered, loop.remove_reader(fd)

    registered, still = anyio.run(main)
    assert registered is True
    assert still is False


def test_events_lost_by_the_kernel_count_as_the_exit_file_landing(tmp_path: Path) -> None:
    # An inotify queue overflow (IN_Q_OVERFLOW, wd -1, no name) may have dropped exit.json's event.
    overflow = _DirWatch._EVENT.pack(-1, _DirWatch._IN_Q_OVERFLOW, 0, 0)
    name = EVENTS_NAME.encode().ljust(16, b"\0")
    modified = _DirWatch._EVENT.pack(1, _DirWatch._IN_MODIFY, 0, len(name)) + name
    assert _DirWatch._names(modified, os.fsencode(EXIT_NAME)) is False
    assert _DirWatch._names(modified + overflow, os.fsencode(EXIT_NAME)) is True
