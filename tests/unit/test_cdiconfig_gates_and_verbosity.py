"""CDIConfig's feature gates and logVerbosity: the one rule the webhook and the controller share
for claim adoption, the verbosity-to-level mapping, and a process's logging following it."""

from __future__ import annotations

import logging

import pytest

from cdi.api.config import CDIConfig, claim_adoption_allowed, log_level_for
from cdi.api.constants import GATE_CLAIM_ADOPTION
from cdi.lifecycle import LogVerbosity


def config(**spec: object) -> CDIConfig:
    return CDIConfig.from_dict({"metadata": {"name": "config"}, "spec": spec})


def test_a_gate_is_on_only_when_cdiconfig_lists_it() -> None:
    assert config(featureGates=[GATE_CLAIM_ADOPTION]).gate(GATE_CLAIM_ADOPTION)
    assert not config(featureGates=["HonorWaitForFirstConsumer"]).gate(GATE_CLAIM_ADOPTION)
    assert not CDIConfig().gate(GATE_CLAIM_ADOPTION)


@pytest.mark.parametrize(
    ("annotation", "gate", "allowed"),
    [
        (None, True, True),  # no annotation: the gate decides
        (None, False, False),
        ("true", False, True),  # present, the annotation decides whatever the gate says
        ("True", False, True),  # Go's ParseBool spellings, for the controller as for the webhook
        ("1", False, True),
        ("false", True, False),
        ("yes", True, False),  # unparsable: false, as CDI ignores the error
    ],
)
def test_claim_adoption_follows_the_annotation_then_the_gate(
    annotation: str | None, gate: bool, allowed: bool
) -> None:
    asked: list[bool] = []

    def gate_on() -> bool:
        asked.append(True)
        return gate

    assert claim_adoption_allowed(annotation, gate_on) is allowed
    assert bool(asked) == (annotation is None)  # CDIConfig is read only when it decides


@pytest.mark.parametrize(
    ("verbosity", "level"),
    [
        (-1, logging.WARNING),
        (0, logging.WARNING),
        (1, logging.INFO),
        (2, logging.INFO),
        (3, logging.DEBUG),
        (9, logging.DEBUG),
    ],
)
def test_log_verbosity_maps_to_a_logging_level(verbosity: int, level: int) -> None:
    assert log_level_for(verbosity) == level
    assert config(logVerbosity=verbosity).log_level == level


def test_a_process_logs_at_cdiconfigs_verbosity_and_back_at_the_flags_once_unset() -> None:
    logger = logging.getLogger("test-verbosity")
    logger.setLevel(logging.INFO)  # --log-level INFO
    follow = LogVerbosity(logger)
    follow.apply(config(logVerbosity=5))
    assert logger.level == logging.DEBUG
    assert logger.isEnabledFor(logging.DEBUG)
    follow.apply(config(logVerbosity=0))
    assert not logger.isEnabledFor(logging.INFO)
    assert logger.isEnabledFor(logging.WARNING)
    follow.apply(CDIConfig())  # unset (or CDIConfig deleted): the flag's level again
    assert logger.level == logging.INFO


def test_the_flag_level_given_wins_over_the_loggers_current_one() -> None:
    logger = logging.getLogger("test-verbosity-flag")
    logger.setLevel(logging.DEBUG)  # a previous term of the controller left DEBUG
    follow = LogVerbosity(logger, flag_level=logging.WARNING)
    follow.apply(CDIConfig())
    assert logger.level == logging.WARNING
