"""The Spark settings a job depends on are checked before any task starts:
each wrong one is named with its value and what to set instead."""
from __future__ import annotations

import pytest

from flux.spark.settings import REQUIRED_CONF, setting_problems

pytestmark = pytest.mark.timeout(30)


def test_the_settings_of_flux_sessions_pass_on_every_master():
    for master in ("local-cluster[5,1,1024]", "spark://10.0.0.1:7077", "yarn",
                   "k8s://https://api:6443"):
        assert setting_problems(dict(REQUIRED_CONF), master) == []


def test_sparks_defaults_on_a_cluster_are_refused_for_task_retries():
    problems = setting_problems({}, "spark://10.0.0.1:7077")
    assert len(problems) == 1
    assert "spark.task.maxFailures is 4" in problems[0] and "1000" in problems[0]


@pytest.mark.parametrize("key, value, words", [
    ("spark.excludeOnFailure.enabled", "true", "set it to false"),
    ("spark.blacklist.enabled", "true", "set it to false"),
    ("spark.dynamicAllocation.enabled", "true", "spark.executor.instances"),
    ("spark.speculation", "true", "second process"),
    ("spark.task.maxFailures", "8", "is 8"),
])
def test_each_setting_that_breaks_a_job_is_named(key, value, words):
    problems = setting_problems({**REQUIRED_CONF, key: value}, "yarn")
    assert len(problems) == 1 and key in problems[0] and words in problems[0]


def test_local_mode_has_no_retries_to_check():
    assert setting_problems({}, "local[4]") == []
