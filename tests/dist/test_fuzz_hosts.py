"""Fuzzing ``gluontl launch --hosts`` files (tests/fuzzing.py): a real hosts file, mutated, is read
or refused with a LaunchError, within the worker's memory and time bounds."""
from __future__ import annotations

import pytest
from hypothesis import given

from tests.fuzzing import fuzz, fuzz_settings, mutated

HOSTS = b"# the lab's machines\nnode1 cpus=8\nuser@node2.example.org cpus=16\n10.0.0.7\nlocalhost  # here\n"


@pytest.mark.fuzz
@fuzz_settings(40)
@given(mutated(HOSTS, (b"node3 cpus=" + b"9" * 5000 + b"\n", b"node4 cpus=-1\n", b"n\xc3\xb6de cpus=2\n")))
def test_fuzz_hosts_file(tmp_path_factory, data):
    fuzz("hosts", tmp_path_factory.getbasetemp(), {"hosts": data})


def test_a_cpu_count_past_python_s_digit_limit_is_refused_naming_the_line(tmp_path):
    """Found by scripts/fuzz.sh: 5000 digits raised ValueError from int() (an internal error)."""
    from gluontl.dist.launch import read_hosts
    from gluontl.errors import LaunchError

    (tmp_path / "hosts").write_text("node1\nnode3 cpus=" + "9" * 5000 + "\n")
    with pytest.raises(LaunchError, match="line 2"):
        read_hosts(tmp_path / "hosts")
