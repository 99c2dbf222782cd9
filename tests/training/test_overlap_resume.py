"""rollout.overlap_env and rollout.overlap_pieces never change the episodes, so a run may be
resumed with them changed (run_folder.RESUMABLE), and it plays what the uninterrupted
sequential run plays."""

from __future__ import annotations

import pytest

from mcgpo.cli import main


@pytest.mark.slow
def test_a_run_resumed_with_overlap_on_plays_the_sequential_episodes(smoke_args, tmp_path):
    import pandas as pd

    base = ("--deterministic", "--threads", "1", "--eval.tasks", "0", "--save-rollouts")
    assert main(smoke_args(tmp_path / "plain", *base, "--train.updates", "2")) == 0
    resumed = tmp_path / "resumed"
    assert main(smoke_args(resumed, *base, "--train.updates", "1")) == 0
    overlap = ("--rollout.overlap_env", "true", "--rollout.overlap_pieces", "3")
    assert main(smoke_args(resumed, *base, "--train.updates", "2", "--resume", *overlap)) == 0
    name = "rollouts/update-000002.parquet"
    a, b = pd.read_parquet(tmp_path / "plain" / name), pd.read_parquet(resumed / name)
    assert len(a) > 0
    for column in ("group", "slot", "turn", "action", "reward", "state", "response"):
        assert a[column].tolist() == b[column].tolist(), column
