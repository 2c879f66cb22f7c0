"""The service process hands freed memory back to the system (issue 11; cellblock.server.memory)."""

import os
import subprocess
import sys

import pytest

from cellblock.server import memory


@pytest.mark.skipif(memory._LIBC is None, reason="glibc only")
def test_the_service_reexecutes_itself_with_the_system_allocator_unless_told_otherwise() -> None:
    code = "from cellblock.server.memory import use_system_allocator; use_system_allocator(); import os, sys; print(os.environ['PYTHONMALLOC'], sys.argv[1:])"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC"}
    out = subprocess.run([sys.executable, "-c", code, "arg"], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "malloc ['arg']", out.stderr
    kept = subprocess.run([sys.executable, "-c", code, "arg"], env={**env, "PYTHONMALLOC": "pymalloc"}, capture_output=True, text=True, timeout=60, check=True)
    assert kept.stdout.strip() == "pymalloc ['arg']", kept.stderr


def test_freezing_the_start_up_heap_leaves_later_objects_collectable() -> None:
    import gc

    try:
        frozen = memory.freeze_startup_heap()
        assert frozen == gc.get_freeze_count() > 1000
        before = len(gc.get_objects())  # frozen objects are not among them

        class Cycle:
            pass

        garbage = [Cycle() for _ in range(10_000)]
        for item in garbage:
            item.self = item  # type: ignore[attr-defined]
        del garbage, item
        assert len(gc.get_objects()) >= before + 10_000
        gc.collect()
        assert len(gc.get_objects()) < before + 100  # cycles created after the freeze are still collected
    finally:
        gc.unfreeze()
