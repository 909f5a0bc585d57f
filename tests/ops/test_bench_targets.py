"""bench/run.py's verdicts on the targets (pure functions over a result dict): a
number may only be called met or missed where the run shows it (a review of
the harness, session 41)."""

from bench.run import capacity_rows, target_rows


def step(rate, met=True, **fields):
    return {"rate_per_second": rate, "meets_slo": met, **fields}


def capacity(ours, peer, **fields):
    from bench.scenarios.capacity import capacity_at_slo, lower_bound

    ours_cap, peer_cap = capacity_at_slo(ours), capacity_at_slo(peer)
    return {
        "ours": ours,
        "peer": peer,
        "capacity_at_slo": ours_cap,
        "peer_capacity_at_slo": peer_cap,
        "capacity_is_lower_bound": lower_bound(ours, ours_cap),
        "peer_capacity_is_lower_bound": lower_bound(peer, peer_cap),
        **fields,
    }


def peer_row(cap):
    (row,) = [r for r in capacity_rows(cap, None) if "peer" in r["target"]]
    return row


def test_the_peer_ratio_is_decided_only_when_the_steps_decide_it():
    # session 37: ours 1,750 (2,000 missed), the peer 350 (500 missed): 3.5-5.7x
    undecided = capacity(
        [step(1500), step(1750), step(2000, met=False)], [step(350), step(500, met=False)]
    )
    row = peer_row(undecided)
    assert (row["value"], row["met"]) == (5.0, None)
    assert "3.50 to 5.71" in row["note"]
    met = capacity([step(1750), step(2000, met=False)], [step(300), step(350, met=False)])
    assert peer_row(met)["met"] is True  # > 1,750 / 350 = 5
    missed = capacity([step(1000), step(1200, met=False)], [step(350), step(500, met=False)])
    assert peer_row(missed)["met"] is False  # < 1,200 / 350
    peer_met_all = capacity([step(1000), step(1500, met=False)], [step(100), step(350)])
    assert peer_row(peer_met_all)["met"] is False  # < 1,500 / 350 however high the peer goes
    peer_met_all = capacity([step(1750), step(2000, met=False)], [step(100), step(350)])
    assert peer_row(peer_met_all)["met"] is None  # 2,000 / 350 > 5: the peer's edge unknown
    both_met_all = capacity([step(1750)], [step(350)])
    assert peer_row(both_met_all)["met"] is None


def at_capacity_rows(cap):
    return {r["target"]: r for r in target_rows({"capacity": cap}) if "at capacity" in r["target"]}


def test_at_capacity_rows_need_the_capacity_step_reached():
    at = {
        "schedule_p95_ms": 14.4,
        "status_p95_ms": 9.0,
        "sweep_interval_p99_le_seconds": 0.5,
        "sweep_interval_p99_above_seconds": None,
    }
    met_every_step = capacity([step(100)], [], at_capacity=at)
    rows = at_capacity_rows(met_every_step)
    assert {r["met"] for r in rows.values()} == {None}  # s37-peer-higher said "yes"
    found = capacity([step(100), step(200, met=False)], [], at_capacity=at)
    assert {r["met"] for r in at_capacity_rows(found).values()} == {True}
    over = capacity([step(100)], [], at_capacity={**at, "schedule_p95_ms": 140})
    (schedule,) = [r for t, r in at_capacity_rows(over).items() if "schedule" in t]
    assert schedule["met"] is False  # over the limit already below the real capacity


def test_a_sweep_p99_above_the_last_bucket_is_missed_not_unexported():
    at = {
        "schedule_p95_ms": 14.4,
        "status_p95_ms": 9.0,
        "sweep_interval_p99_le_seconds": None,
        "sweep_interval_p99_above_seconds": 10.0,
    }
    cap = capacity([step(100), step(200, met=False)], [], at_capacity=at)
    (sweep,) = [r for t, r in at_capacity_rows(cap).items() if "sweep" in t]
    assert sweep["met"] is False and "above the last bucket" in sweep["note"]


def test_a_drain_with_payments_left_open_or_failed_misses():
    drain = {"payments": 100_000, "drain_seconds": 30.0, "checks": {"failed": 0}}
    rows = {r["target"]: r for r in target_rows({"drain": drain})}
    assert rows["drain: 100k due at once, drain seconds"]["met"] is True
    for broken in ({"still_open_at_timeout": 12}, {"checks": {"failed": 3}}):
        rows = {r["target"]: r for r in target_rows({"drain": {**drain, **broken}})}
        assert rows["drain: 100k due at once, drain seconds"]["met"] is False
