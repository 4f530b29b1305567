"""Quotas live (fair policy): a team reclaims its guarantee by preempting a borrower,
which goes back to the queue and resumes from its checkpoint afterwards."""

from __future__ import annotations

from harness import wait_for

# Resumable: keeps its progress in $CKPT (a shared folder: the sandbox gives every attempt a
# fresh private /tmp) and says where it resumed.
RESUMABLE = (
    'mkdir -p "$CKPT"; f="$CKPT/rank$RANK"; '
    'if [ -f "$f" ]; then echo "resumed from $(cat $f)"; fi; '
    'echo "attempt $AICLUSTER_ATTEMPT" > "$f"; sleep 600'
)


def test_team_reclaims_quota_by_preempting_a_borrower(admin, shared_dir):
    for team in ("q-owner", "q-borrower"):
        if team not in admin.teams():
            admin.create_team(team)
    set_quota = lambda team, body: admin.set_quota(team, "gpu", body)
    set_quota("q-owner", {"gpus": 4, "borrow_gpus": 0})
    set_quota("q-borrower", {"gpus": 0})
    borrower = admin.submit(
        {
            "kind": "job",
            "name": "borrow",
            "team": "q-borrower",
            "workers": 2,
            "resources": {"gpus": 2},
            "command": RESUMABLE,
            "env": {"CKPT": str(shared_dir / "ckpt")},
        },
        None,
    )
    admin.wait(borrower["id"], {"RUNNING"}, timeout=60)
    try:
        owner = admin.submit(
            {
                "kind": "job",
                "name": "reclaim",
                "team": "q-owner",
                "resources": {"gpus": 2},
                "command": "sleep 600",
            },
            None,
        )
        admin.wait(owner["id"], {"RUNNING"}, timeout=60)
        job = admin.job(borrower["id"])
        preempted = [e for e in job["events"] if (e["message"] or "").startswith("preempted")]
        assert preempted, job["events"]
        assert "q-owner" in preempted[-1]["message"] or "guarantee" in preempted[-1]["message"]
        assert job["restarts"] == 0, "a preemption spends no restart"
        waiting = wait_for(
            lambda: (j := admin.job(borrower["id"]))["status"] == "PENDING" and j["message"] and j,
            what="a wait reason",
        )
        queue = admin.queue(every=True)
        (entry,) = [q for q in queue if q["workload"] == borrower["id"]]
        assert entry["wait_kind"] in {"capacity", "quota", "preempting"}, entry
        assert waiting["message"]
        admin.cancel(owner["id"])
        back = admin.wait(borrower["id"], {"RUNNING"}, timeout=60)
        assert back["attempt"] == 2
        wait_for(
            lambda: b"resumed from attempt 1" in admin.logs(borrower["id"])[0],
            what="the resumed log line",
        )
    finally:
        for job_id in (borrower["id"],):
            admin.cancel(job_id)
        set_quota("q-owner", {"gpus": 0})
