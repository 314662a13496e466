"""Fixtures for the t5x.tasks tests (the built-in tasks are registered for all of them)."""

from __future__ import annotations

import os
import sys

import pytest

import t5x.tasks as tt
from t5x.tasks.builtin import register_builtin_tasks
from t5x.vocabularies import ByteVocabulary

sys.path.insert(0, os.path.dirname(__file__))
register_builtin_tasks()


@pytest.fixture(scope="session")
def vocab():
    return ByteVocabulary(extra_ids=100)


@pytest.fixture
def clean_registry():
    """Removes what a test registered, keeping the built-ins."""
    before_tasks, before_mixtures = set(tt.TaskRegistry.names()), set(tt.MixtureRegistry.names())
    yield
    for name in set(tt.MixtureRegistry.names()) - before_mixtures:
        tt.MixtureRegistry.remove(name)
    for name in set(tt.TaskRegistry.names()) - before_tasks:
        tt.TaskRegistry.remove(name)
