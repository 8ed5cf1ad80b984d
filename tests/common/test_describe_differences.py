"""A refused reuse names what changed: each differing setting with its value there and now."""

from __future__ import annotations

from pipeline.models.fingerprints import describe_differences


def test_each_differing_key_is_named_with_both_values():
    assert describe_differences({"seed": 1, "task": "rte"}, {"seed": 2, "task": "rte"}) == ["seed 1 there, 2 now"]


def test_a_setting_inside_a_nested_dict_is_named_by_both_keys_not_the_whole_dict():
    there = {"recipe": {"train.lr": 1e-3, "train.epochs": 3}}
    now = {"recipe": {"train.lr": 5e-4, "train.epochs": 3}}
    assert describe_differences(there, now) == ["recipe train.lr 0.001 there, 0.0005 now"]


def test_a_key_on_one_side_only_differs_unless_left_out_of_keys():
    there, now = {"seed": 1, "metrics": {"accuracy": 0.5}}, {"seed": 1, "scratch": False}
    assert describe_differences(there, now) == ["metrics {'accuracy': 0.5} there, None now",
                                                "scratch None there, False now"]
    assert describe_differences(there, now, keys=["seed"]) == []
