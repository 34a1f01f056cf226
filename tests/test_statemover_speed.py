"""The StateMover speed experiment moves a state whole, with and without the services."""
from __future__ import annotations

import pytest

from experiments.statemover_speed import move

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("direct", [False, True])
def test_a_moved_state_arrives_whole(direct):
    result = move(3, chunk=1 << 20, direct=direct)
    assert result["verified"] and result["through_statemover_services"] is not direct


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "3"], "even"), (["--modes", "flux,raid"], "unknown mode"),
    (["--inputs", "0"], "--inputs"),
])
def test_the_overhead_experiment_refuses_bad_flags(argv, message, capsys):
    from experiments.overhead import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err
