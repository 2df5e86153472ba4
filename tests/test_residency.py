"""Expert residency: groups, plans, paging under a budget, eviction order, resizing."""

from __future__ import annotations

import random
import threading

import numpy as np
import onnx_ir as ir
import pytest

from nxrt.errors import InvalidArgument, OutOfMemory
from nxrt.memory import MemoryGovernor, parse_bytes
from nxrt.moe.residency import (
    AdmissionPolicyInput,
    EvictionClass,
    ExpertResidencyManager,
    ResidencyDecision,
    ResidencyDegradationReason,
    ResidencyPlan,
    ResidencyResizePlan,
    ResidencyResizeRequest,
    ResizeDirection,
    ResizeRejection,
    ResizeSafePoint,
    StaticProfileResidencyPolicy,
    WholeBankReason,
    WholeBankResidentPolicy,
    choose_victims,
    expert_weight_groups,
    plan_residency,
    plan_resize,
    prove_routed_residency,
)
from nxrt.pipeline.external_data import ExternalDataRegistry, ExternalLazyWeight, ExternalTensorRef
from nxrt.weight import LazyWeight

E = 8
# Per expert: a uint8 [4, 8] weight (32 bytes) and float32 [4, 2] scales (32 bytes).
WEIGHT = np.arange(E * 4 * 8, dtype=np.uint32).astype(np.uint8).reshape(E, 4, 8)
SCALES = np.arange(E * 4 * 2, dtype=np.float32).reshape(E, 4, 2)
EXPERT = 64


@pytest.fixture
def lazy_weights(tmp_path):
    """Two lazy weights over one data file, experts on the leading axis."""
    (tmp_path / "w.bin").write_bytes(b"\0" * 100 + WEIGHT.tobytes() + SCALES.tobytes())
    mapping = ExternalDataRegistry(str(tmp_path)).open("w.bin", "w")
    refs = {
        2: ExternalTensorRef(
            "fc1_weight",
            mapping,
            mapping.region(100, WEIGHT.nbytes),
            ir.DataType.UINT8,
            WEIGHT.shape,
        ),
        3: ExternalTensorRef(
            "fc1_scales",
            mapping,
            mapping.region(100 + WEIGHT.nbytes, SCALES.nbytes),
            ir.DataType.FLOAT,
            SCALES.shape,
        ),
    }
    return {index: ExternalLazyWeight(ref) for index, ref in refs.items()}


def manager_for(lazy_weights, budget, policy=None):
    manager = ExpertResidencyManager(budget, policy)
    bank = manager.register_bank(lazy_weights, E)
    return manager, bank


# -- groups ------------------------------------------------------------------------------------


def test_groups_are_contiguous_per_expert_slices(lazy_weights):
    groups = expert_weight_groups(lazy_weights, E, bank=3)
    assert [g.key for g in groups] == [(3, e) for e in range(E)]
    assert all(g.nbytes == EXPERT for g in groups)
    weight, scales = groups[5].slices
    assert (weight.input_index, weight.region.offset, weight.region.len) == (2, 100 + 5 * 32, 32)
    assert scales.region.offset == 100 + WEIGHT.nbytes + 5 * 32
    assert (weight.shape, scales.shape, scales.dtype) == ((4, 8), (4, 2), np.float32)
    assert weight.source.bytes_view(weight.region).tobytes() == WEIGHT[5].tobytes()


def test_groups_need_a_layout_and_a_matching_expert_count(lazy_weights):
    with pytest.raises(InvalidArgument, match="has 8 experts"):
        expert_weight_groups(lazy_weights, 4)
    bare = LazyWeight.block_quantized_moe(lazy_weights[2].regions, lazy_weights[2].materialize)
    with pytest.raises(InvalidArgument, match="without a layout"):
        expert_weight_groups({2: bare}, E)


# -- plans -------------------------------------------------------------------------------------


def test_whole_bank_is_pinned_when_it_fits(lazy_weights):
    groups = expert_weight_groups(lazy_weights, E)
    for budget, reason in ((None, WholeBankReason.UNLIMITED), (E * EXPERT, WholeBankReason.FITS)):
        plan = plan_residency(groups, budget, WholeBankResidentPolicy())
        assert len(plan.resident) == E and not plan.paged and not plan.degraded
        assert set(plan.classes.values()) == {EvictionClass.PINNED}
        assert plan.whole_bank is reason
        assert plan.resident_bytes == E * EXPERT


def test_whole_bank_degrades_to_paging_with_a_reason(lazy_weights):
    plan = plan_residency(expert_weight_groups(lazy_weights, E), 3 * EXPERT)
    assert plan.resident == () and len(plan.paged) == E
    assert plan.decisions[(0, 0)] is ResidencyDecision.PAGED
    ((reason, detail),) = plan.degradations
    assert reason is ResidencyDegradationReason.BANK_EXCEEDS_BUDGET
    assert "needs 512 bytes" in detail and "192" in detail
    assert plan.whole_bank is WholeBankReason.EXCEEDS_BUDGET
    assert "degraded" in plan.describe()


def test_static_profile_keeps_the_hottest_experts_and_room_to_stream(lazy_weights):
    groups = expert_weight_groups(lazy_weights, E)
    policy = StaticProfileResidencyPolicy([1, 0, 7, 7, 3, 0, 0, 9])
    plan = plan_residency(groups, 4 * EXPERT, policy)
    # Room for 3 profiled experts (one slot kept for streaming): 7, then the tie 2 before 3.
    assert set(plan.resident) == {(0, 7), (0, 2), (0, 3)}
    assert all(plan.classes[k] is EvictionClass.PROFILED for k in plan.resident)
    reasons = [r for r, _ in plan.degradations]
    assert ResidencyDegradationReason.PROFILE_EXCEEDS_BUDGET in reasons
    unlimited = plan_residency(groups, None, policy)
    assert len(unlimited.resident) == 5  # every expert with usage


def test_one_expert_larger_than_the_budget_is_out_of_memory(lazy_weights):
    groups = expert_weight_groups(lazy_weights, E)
    with pytest.raises(OutOfMemory) as error:
        plan_residency(groups, EXPERT - 1)
    assert (error.value.requested, error.value.available) == (EXPERT, EXPERT - 1)
    with pytest.raises(OutOfMemory):
        ExpertResidencyManager(EXPERT - 1).register_bank(lazy_weights, E)


def test_a_policy_that_overspends_is_caught(lazy_weights):
    class Greedy:
        name = "greedy"

        def plan(self, policy_input):
            keys = [g.key for g in policy_input.groups]
            return ResidencyPlan(
                policy_input.budget,
                dict.fromkeys(keys, ResidencyDecision.RESIDENT),
                dict.fromkeys(keys, EvictionClass.PINNED),
                sizes={g.key: g.nbytes for g in policy_input.groups},
            )

    with pytest.raises(InvalidArgument, match="over a budget"):
        plan_residency(expert_weight_groups(lazy_weights, E), 2 * EXPERT, Greedy())


# -- paging ------------------------------------------------------------------------------------


def test_unlimited_budget_preloads_the_whole_bank(lazy_weights):
    manager, bank = manager_for(lazy_weights, None)
    assert manager.resident_experts(bank) == list(range(E))
    with prove_routed_residency(manager, bank, [6, 1]) as proof:
        assert proof.coverage.hits == (1, 6) and proof.coverage.paged_in == ()
        np.testing.assert_array_equal(proof.weights(6)[2], WEIGHT[6])
        np.testing.assert_array_equal(proof.weights(1)[3], SCALES[1])


def test_paged_experts_are_owned_copies_of_the_mapping(lazy_weights):
    manager, bank = manager_for(lazy_weights, 2 * EXPERT)
    assert manager.resident_experts(bank) == []
    with manager.prove(bank, [4]) as proof:
        weight = proof.weights(4)[2]
        assert not weight.flags.writeable
        mapping = lazy_weights[2].file
        assert not np.shares_memory(weight, mapping._buffer)
        np.testing.assert_array_equal(weight, WEIGHT[4])
        assert proof.coverage.paged_in == (4,)
    assert manager.resident_bytes == EXPERT


def test_eviction_is_least_recently_used_within_the_budget(lazy_weights):
    manager, bank = manager_for(lazy_weights, 3 * EXPERT)
    for e in (0, 1, 2):
        manager.prove(bank, [e]).release()
    manager.prove(bank, [0]).release()  # 0 is now the most recently used
    with manager.prove(bank, [5]) as proof:
        assert proof.coverage.evicted == ((0, 1),)
    assert manager.resident_experts(bank) == [0, 2, 5]
    assert manager.governor.peak <= 3 * EXPERT
    assert manager.stats["evictions"] == 1 and manager.stats["hits"] == 1


def test_eviction_takes_streamed_experts_before_profiled_ones(lazy_weights):
    policy = StaticProfileResidencyPolicy({3: 5.0})
    manager, bank = manager_for(lazy_weights, 3 * EXPERT, policy)
    assert manager.resident_experts(bank) == [3]  # preloaded by the plan
    manager.prove(bank, [1]).release()
    manager.prove(bank, [3]).release()  # the profiled expert is the most recent...
    manager.prove(bank, [2]).release()
    with manager.prove(bank, [6]) as proof:  # ...but a streamed one still goes first
        assert proof.coverage.evicted == ((0, 1),)
    with manager.prove(bank, [6, 7, 2]) as proof:
        assert set(proof.coverage.evicted) == {(0, 3)}


def test_choose_victims_orders_by_class_then_age():
    candidates = (
        ((0, 1), EvictionClass.PROFILED, 1, 10),
        ((0, 2), EvictionClass.STREAMED, 9, 10),
        ((0, 3), EvictionClass.STREAMED, 4, 10),
    )
    assert choose_victims(AdmissionPolicyInput(15, 0, candidates)) == [(0, 3), (0, 2)]
    assert choose_victims(AdmissionPolicyInput(25, 0, candidates)) == [(0, 3), (0, 2), (0, 1)]
    assert choose_victims(AdmissionPolicyInput(35, 0, candidates)) is None
    assert choose_victims(AdmissionPolicyInput(5, 5, candidates)) == []


def test_waves_split_routed_experts_that_do_not_fit_at_once(lazy_weights):
    manager, bank = manager_for(lazy_weights, 3 * EXPERT)
    manager.prove(bank, [6]).release()
    waves = manager.waves(bank, [0, 6, 2, 4, 5, 0])
    assert waves[0][0] == 6  # already resident: used before anything is evicted
    assert sorted(e for wave in waves for e in wave) == [0, 2, 4, 5, 6]
    assert all(len(wave) <= 3 for wave in waves)
    with pytest.raises(OutOfMemory) as error:
        manager.prove(bank, [0, 1, 2, 3])
    assert (error.value.requested, error.value.available) == (4 * EXPERT, 3 * EXPERT)


def test_pinned_experts_of_another_bank_leave_too_little_room(lazy_weights):
    manager = ExpertResidencyManager(E * EXPERT + EXPERT // 2)
    first = manager.register_bank(lazy_weights, E)  # the whole bank fits: pinned
    assert manager.resident_experts(first) == list(range(E))
    second = manager.register_bank(lazy_weights, E)  # no longer fits: everything streamed
    assert not manager.plan.resident
    with manager.prove(second, [0]) as proof:
        assert proof.coverage.evicted  # the first bank's experts were demoted and evicted


def test_concurrent_proofs_stay_within_the_budget(lazy_weights):
    manager, bank = manager_for(lazy_weights, 3 * EXPERT)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        try:
            for _ in range(60):
                experts = rng.sample(range(E), rng.randint(1, 3))
                with manager.prove(bank, experts, timeout=10) as proof:
                    for e in experts:
                        assert proof.weights(e)[2].tobytes() == WEIGHT[e].tobytes()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert manager.governor.peak <= 3 * EXPERT
    assert manager.resident_bytes <= 3 * EXPERT


def test_a_released_proof_cannot_be_read(lazy_weights):
    manager, bank = manager_for(lazy_weights, None)
    proof = manager.prove(bank, [1])
    proof.release()
    proof.release()
    with pytest.raises(InvalidArgument, match="released"):
        proof.weights(1)
    with pytest.raises(InvalidArgument, match="not in bank"):
        manager.prove(bank, [E])


# -- resizing ----------------------------------------------------------------------------------


def test_plan_resize_directions_and_rejection(lazy_weights):
    groups = expert_weight_groups(lazy_weights, E)
    small = plan_residency(groups, 2 * EXPERT)
    grown = plan_resize(small, groups, ResidencyResizeRequest(E * EXPERT))
    assert isinstance(grown, ResidencyResizePlan)
    assert grown.direction is ResizeDirection.GROW and len(grown.admit) == E
    shrunk = plan_resize(grown.plan, groups, ResidencyResizeRequest(2 * EXPERT))
    assert shrunk.direction is ResizeDirection.SHRINK and len(shrunk.demote) == E
    same = plan_resize(small, groups, ResidencyResizeRequest(2 * EXPERT))
    assert same.direction is ResizeDirection.UNCHANGED
    rejected = plan_resize(small, groups, ResidencyResizeRequest(EXPERT - 1))
    assert isinstance(rejected, ResizeRejection)
    assert (rejected.requested, rejected.minimum) == (EXPERT - 1, EXPERT)


def test_resize_applies_between_runs_only(lazy_weights):
    manager, bank = manager_for(lazy_weights, 2 * EXPERT)
    proof = manager.prove(bank, [1, 2])
    manager.request_resize(E * EXPERT)
    assert manager.safe_point() is None  # a compute holds experts: not a safe point
    proof.release()
    outcome = manager.safe_point()
    assert outcome.applied and outcome.safe_point is ResizeSafePoint.BETWEEN_RUNS
    assert outcome.plan.direction is ResizeDirection.GROW
    assert manager.resident_experts(bank) == list(range(E))  # the whole bank now fits
    assert manager.safe_point() is None  # nothing pending


def test_shrinking_evicts_down_to_the_new_budget(lazy_weights):
    manager, bank = manager_for(lazy_weights, None)
    outcome = manager.resize(3 * EXPERT)
    assert outcome.applied and outcome.safe_point is ResizeSafePoint.IDLE
    assert len(outcome.evicted) == E - 3
    assert manager.resident_bytes <= 3 * EXPERT
    assert manager.budget == 3 * EXPERT
    with manager.prove(bank, [0, 7]):
        assert manager.resident_bytes <= 3 * EXPERT


def test_a_rejected_resize_leaves_everything_as_it_was(lazy_weights):
    manager, bank = manager_for(lazy_weights, 3 * EXPERT)
    outcome = manager.resize(EXPERT // 2)
    assert not outcome.applied and outcome.rejection.minimum == EXPERT
    assert manager.budget == 3 * EXPERT
    assert manager.last_resize is outcome


def test_resize_while_busy_is_deferred(lazy_weights):
    manager, bank = manager_for(lazy_weights, 3 * EXPERT)
    with manager.prove(bank, [0]):
        outcome = manager.resize(4 * EXPERT)
        assert not outcome.applied and outcome.safe_point is None
    assert manager.safe_point().applied
    assert manager.budget == 4 * EXPERT


# -- the memory governor -----------------------------------------------------------------------


def test_governor_accounts_by_site_and_refuses_overruns():
    governor = MemoryGovernor(100)
    governor.reserve("a", 60)
    governor.reserve("b", 30)
    assert governor.usage_by_site() == {"a": 60, "b": 30}
    assert governor.available == 10 and not governor.fits(11)
    with pytest.raises(OutOfMemory) as error:
        governor.reserve("c", 20)
    assert (error.value.requested, error.value.available) == (20, 10)
    governor.release("a", 60)
    assert governor.used == 30 and governor.peak == 90
    with pytest.raises(InvalidArgument):
        governor.release("b", 31)
    with pytest.raises(OutOfMemory):
        governor.check(101)
    unlimited = MemoryGovernor()
    unlimited.reserve("x", 10**15)
    assert unlimited.available is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (1234, 1234),
        ("1234", 1234),
        ("64MiB", 64 * 2**20),
        ("1.5 GB", 1_500_000_000),
        ("2k", 2048),
        (None, None),
        ("", None),
    ],
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["many", "-3MB", True, -1])
def test_parse_bytes_refuses_nonsense(bad):
    with pytest.raises(InvalidArgument):
        parse_bytes(bad)
