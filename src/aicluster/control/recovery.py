"""How long an interrupted job took to run again, measured from the interruption, in phases.

Vocabulary (every time is the control plane's clock; phases never overlap):
- interruption: when the attempt stopped making progress. For a lost node or worker, the
  last time every worker of the attempt answered the control plane (its node died at most
  one tick later); for a preemption, drain or restart, the moment the platform stopped it.
- detection: interruption -> the attempt ended (its requeue): Ray declaring the node dead,
  or the grace a vanished worker gets.
- queue: requeue -> admitted again (waiting for room).
- launch: admitted -> RUNNING (placement group, workers started, inputs materialised).
- replay (an estimate): the work the job redoes once running: from its newest checkpoint
  saved during the interrupted attempt (else from that attempt's start) to the
  interruption, at the speed it ran before.

Recovery = detection + queue + launch, all measured; replay is said and counted apart,
because the platform sees a job's progress only through its checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

from aicluster.store.jobs import AttemptRecord

PHASES = ("detection", "queue", "launch", "replay")


@dataclass(frozen=True)
class Checkpoint:
    """The newest checkpoint a job had saved when it was interrupted."""

    saved_at: float
    step: int | None


@dataclass(frozen=True)
class Recovery:
    cause: str
    detection_s: float
    queue_s: float
    launch_s: float
    replay_s: float | None  # estimated; None when the attempt never ran
    checkpoint_step: int | None  # the step replay starts from, when the job said it

    @property
    def total_s(self) -> float:
        return self.detection_s + self.queue_s + self.launch_s

    def phases(self) -> dict[str, float]:
        out = {"detection": self.detection_s, "queue": self.queue_s, "launch": self.launch_s}
        if self.replay_s is not None:
            out["replay"] = self.replay_s
        return out

    def sentence(self) -> str:
        text = (
            f"recovered {self.total_s:.1f} s after {self.cause} (detection "
            f"{self.detection_s:.1f} s, queue {self.queue_s:.1f} s, launch {self.launch_s:.1f} s)"
        )
        if self.replay_s is not None:
            since = (
                f"checkpoint step {self.checkpoint_step}"
                if self.checkpoint_step is not None
                else "its start"
            )
            text += f"; about {self.replay_s:.1f} s of work since {since} to redo"
        return text


def recovery(
    interrupted: AttemptRecord,
    resumed: AttemptRecord,
    running_at: float,
    checkpoint: Checkpoint | None = None,
) -> Recovery | None:
    """The recovery of `interrupted` by `resumed` (its next attempt), which is RUNNING at
    `running_at`; None when `interrupted` did not end in a requeue."""
    if interrupted.ended_at is None or interrupted.end_reason is None:
        return None
    ended = interrupted.ended_at
    since = interrupted.interrupted_at if interrupted.interrupted_at is not None else ended
    since = min(since, ended)
    replay, step = None, None
    if interrupted.started_at is not None:
        base = interrupted.started_at
        if checkpoint is not None and base <= checkpoint.saved_at <= since:
            base, step = checkpoint.saved_at, checkpoint.step
        replay = max(0.0, since - base)
    return Recovery(
        cause=interrupted.end_reason,
        detection_s=max(0.0, ended - since),
        queue_s=max(0.0, resumed.admitted_at - ended),
        launch_s=max(0.0, running_at - resumed.admitted_at),
        replay_s=replay,
        checkpoint_step=step,
    )


def newest_checkpoint(versions, before: float) -> Checkpoint | None:
    """The newest of a job's checkpoint versions (store.artifacts VersionRecords, any
    order) saved at or before `before`."""
    saved = [v for v in versions if v.created_at <= before]
    if not saved:
        return None
    v = max(saved, key=lambda v: v.created_at)
    step = (v.metadata or {}).get("step")
    return Checkpoint(v.created_at, step if isinstance(step, int) else None)
