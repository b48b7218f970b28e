"""The `serve` supervisor's pure parts: restart backoff and how an exit status reads."""

from __future__ import annotations

from service.supervisor import describe_exit, restart_delay


def test_restart_delay_doubles_to_its_cap() -> None:
    assert [restart_delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert restart_delay(50) == 30.0


def test_exit_statuses_read_as_people_say_them() -> None:
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(-11) == "killed by SIGSEGV"
