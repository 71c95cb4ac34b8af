"""What the stateful property tests of a live run share: the platform going
down and coming back as rules, and running a machine within a budget."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from primeruns.local import LocalPlatform


class Outages(RuleBasedStateMachine):
    """A machine whose platform (``lp``) may be stopped and started again."""

    lp: LocalPlatform  # set by ``explore``, before hypothesis runs the machine
    down = False

    @precondition(lambda self: not self.down)
    @rule()
    def platform_down(self) -> None:
        self.lp.stop()
        self.down = True

    @precondition(lambda self: self.down)
    @rule()
    def platform_up(self) -> None:
        self.lp.start()
        self.down = False


def explore(machine: type[Outages], platform: LocalPlatform, **budget: Any) -> None:
    """Run ``machine`` against ``platform`` with hypothesis ``budget``
    (``max_examples``, ``stateful_step_count``, ...), no deadline."""
    machine.lp = platform
    case = machine.TestCase
    case.settings = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], **budget)
    case().runTest()
