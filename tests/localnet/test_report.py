"""The localnet report's plots: every miner drawn so that it can be told apart."""

from __future__ import annotations

from templar.localnet.report import miner_styles


def _miners(honest: int, others: int) -> list[dict]:
    return ([{"name": f"miner{i}", "strategy": "honest"} for i in range(honest)]
            + [{"name": f"adversary{i}", "strategy": "copycat"} for i in range(others)])


def test_no_two_miners_of_a_crowded_localnet_are_drawn_alike_and_honest_work_is_solid():
    for honest, others in ((4, 14), (3, 13), (20, 20), (12, 1)):  # the crowded localnet is 4 + 14
        miners = _miners(honest, others)
        styles = miner_styles(miners)
        assert set(styles) == {m["name"] for m in miners}
        drawn = [(styles[m["name"]]["color"], styles[m["name"]]["linestyle"]) for m in miners]
        assert len(set(drawn)) == len(drawn), (honest, others)
        assert {styles[f"miner{i}"]["linestyle"] for i in range(min(honest, 10))} == {"-"}
        assert all(styles[f"adversary{i}"]["linestyle"] in ("--", ":") for i in range(others))
