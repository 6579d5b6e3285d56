"""Pre-training methods: losses against hand-computed values, and every method learns a fixed batch."""

import math

import pytest
import torch
import torch.nn.functional as F

from pretrain.backbones import create_backbone
from pretrain.methods import METHODS, ViewsConfig, feature_std, simsiam_loss
from pretrain.methods.mocov2 import MoCoV2, MoCoV2Config, in_groups, info_nce, uniformity
from pretrain.methods.simsiam import SimSiam, SimSiamConfig

N_CLASSES = 5


def _tiny_backbone():
    return create_backbone("resnet20", width=0.25)


def _labels(method_cls, b, gen):
    if method_cls.labels == "multihot":
        return (torch.rand(b, N_CLASSES, generator=gen) < 0.4).float()
    if method_cls.labels == "class":
        return torch.arange(b) % N_CLASSES
    return None


def test_simsiam_loss_hand_computed():
    # Prepare: cosines per row are p1.z2 = [1, 0] and p2.z1 = [1, -1]
    p1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z2 = torch.tensor([[2.0, 0.0], [3.0, 0.0]])
    p2 = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    z1 = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    # Execute / Assert: L = (-(1 + 0) / 2 - (1 - 1) / 2) / 2 = -0.25
    assert simsiam_loss(p1, p2, z1, z2).item() == pytest.approx(-0.25)
    assert simsiam_loss(p1, p1, p1, p1).item() == pytest.approx(-1.0)  # perfect prediction


def test_simsiam_stops_gradient_through_targets():
    z1, z2 = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    p1, p2 = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    simsiam_loss(p1, p2, z1, z2).backward()
    assert z1.grad is None and z2.grad is None
    assert p1.grad.abs().sum() > 0 and p2.grad.abs().sum() > 0


def test_moco_loss_hand_computed_and_bank_update():
    torch.manual_seed(0)
    cfg = MoCoV2Config(bank_size=3, out_dim=2, temperature=0.5, hidden_dim=8)
    method = MoCoV2(_tiny_backbone(), cfg)
    bank = torch.tensor([[0.0, 1.0], [-1.0, 0.0], [0.6, 0.8]])
    method.load_extra_state({"bank": bank, "bank_ptr": torch.zeros(1, dtype=torch.long)})
    q = torch.tensor([[3.0, 0.0]], requires_grad=True)  # normalised inside the loss: [1, 0]
    k = torch.tensor([[1.0, 1.0]])  # -> [0.7071, 0.7071]
    loss = method.loss(q, k)
    # logits = [q.k, q.n1, q.n2, q.n3] / T = [0.7071, 0, -1, 0.6] / 0.5; InfoNCE with the positive first
    logits = torch.tensor([math.sqrt(0.5), 0.0, -1.0, 0.6]) / 0.5
    expected = -logits[0] + torch.logsumexp(logits, 0)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    state = method.extra_state()  # training mode: k was pushed into the bank after being read
    assert torch.allclose(state["bank"][0], F.normalize(k, dim=1)[0]) and int(state["bank_ptr"]) == 1
    assert torch.equal(state["bank"][1:], bank[1:])


def _lightly_moco_steps(bank: torch.Tensor, batches: list[tuple[torch.Tensor, torch.Tensor]],
                        temperature: float):
    """lightly's NTXentLoss with a memory bank over the batches: the losses and its bank after them."""
    from lightly.loss import NTXentLoss
    ref = NTXentLoss(temperature=temperature, memory_bank_size=tuple(bank.shape))
    ref.memory_bank.bank.copy_(bank)
    ref.memory_bank.bank_ptr.zero_()
    return [ref(q, k) for q, k in batches], ref.memory_bank


def test_moco_loss_and_bank_equal_lightlys_ntxent_with_a_bank_across_a_wrap():
    """info_nce + KeyBank (position on the device) against lightly's NTXentLoss over batches of 3 into a
    bank of 8: the third batch reaches the end (2 written, 1 dropped, position back to 0), the fourth
    starts over."""
    gen = torch.Generator().manual_seed(0)
    bank = F.normalize(torch.randn(8, 4, generator=gen), dim=1)
    batches = [(torch.randn(3, 4, generator=gen, requires_grad=True), torch.randn(3, 4, generator=gen))
               for _ in range(4)]
    method = MoCoV2(_tiny_backbone(), MoCoV2Config(bank_size=8, out_dim=4, temperature=0.3, hidden_dim=8))
    method.load_extra_state({"bank": bank, "bank_ptr": torch.zeros(1, dtype=torch.long)})
    ours = []
    for i, (q, k) in enumerate(batches):
        ours.append(method.loss(q, k))
        assert int(method.bank.bank_ptr) == [3, 6, 0, 3][i]
    theirs, ref_bank = _lightly_moco_steps(bank, batches, 0.3)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    assert torch.equal(method.bank.bank, ref_bank.bank)
    assert torch.equal(method.bank.bank_ptr, ref_bank.bank_ptr)
    q, k = batches[0]
    before = method.bank.bank.clone()
    (g_ours,) = torch.autograd.grad(method.loss(q, k), q)
    (g_theirs,) = torch.autograd.grad(_lightly_moco_steps(before, [(q, k)], 0.3)[0][0], q)
    assert torch.allclose(g_ours, g_theirs, rtol=1e-5, atol=1e-7)


def test_moco_bank_writes_at_a_loaded_position():
    method = MoCoV2(_tiny_backbone(), MoCoV2Config(bank_size=8, out_dim=4, hidden_dim=8))
    method.loss(torch.randn(3, 4, requires_grad=True), torch.randn(3, 4))
    state = method.extra_state()
    state["bank_ptr"].fill_(5)  # a resumed run's position
    method.load_extra_state(state)
    method.loss(torch.randn(2, 4, requires_grad=True), torch.randn(2, 4))
    assert int(method.bank.bank_ptr) == 7
    method.loss(torch.randn(2, 4), torch.randn(2, 4))  # no grad (evaluation): the bank is not written
    assert int(method.bank.bank_ptr) == 7


def test_an_empty_bank_counts_only_the_keys_written():
    """bank_start=empty (issue 38): each step's loss is InfoNCE over the keys written so far only, the
    plain loss over that slice of the bank (a bank of 8, batches of 3: 0, 3, 6, then 8 keys after the wrap).
    The first step has no negative, so its loss is 0 and its gradient too."""
    gen = torch.Generator().manual_seed(1)
    method = MoCoV2(_tiny_backbone(), MoCoV2Config(bank_size=8, out_dim=4, temperature=0.3, hidden_dim=8,
                                                   bank_start="empty"))
    slots, ptr = [None] * 8, 0  # lightly's writes: from the position on, the rest dropped at the end
    for step in range(4):
        q = torch.randn(3, 4, generator=gen, requires_grad=True)
        k = torch.randn(3, 4, generator=gen)
        keys = [key for key in slots if key is not None]
        want = info_nce(q, k, torch.stack(keys) if keys else torch.zeros(0, 4), 0.3)
        got = method.loss(q, k)
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-7), step
        if step == 0:
            assert got.item() == 0.0 and torch.autograd.grad(got, q)[0].abs().max() == 0
        for key in F.normalize(k, dim=1)[:8 - ptr]:
            slots[ptr], ptr = key, ptr + 1
        ptr %= 8
        assert int(method.bank.filled) == min(3 * (step + 1), 8)


def test_an_empty_bank_resumes_with_its_count_and_old_states_load_full():
    method = MoCoV2(_tiny_backbone(), MoCoV2Config(bank_size=8, out_dim=4, hidden_dim=8, bank_start="empty"))
    method.loss(torch.randn(3, 4, requires_grad=True), torch.randn(3, 4))
    state = method.extra_state()
    again = MoCoV2(_tiny_backbone(), MoCoV2Config(bank_size=8, out_dim=4, hidden_dim=8, bank_start="empty"))
    again.load_extra_state(state)
    assert int(again.bank.filled) == 3 and again.bank.valid().tolist() == [True] * 3 + [False] * 5
    del state["bank_filled"]  # a state written before bank_start: its bank started full
    again.load_extra_state(state)
    assert int(again.bank.filled) == 8
    full = MoCoV2(_tiny_backbone(), MoCoV2Config(bank_size=8, out_dim=4, hidden_dim=8))
    assert full.bank.valid() is None and int(full.bank.filled) == 8


def test_moco_momentum_update_moves_keys_towards_queries():
    torch.manual_seed(0)
    method = MoCoV2(_tiny_backbone(), MoCoV2Config(bank_size=16, key_momentum=0.5))
    q_param = next(method.backbone.parameters())
    k_param = next(method.key_backbone.parameters())
    assert torch.equal(q_param, k_param) and not k_param.requires_grad
    with torch.no_grad():
        q_param.add_(1.0)
    before = k_param.clone()
    method.after_step()
    assert torch.allclose(k_param, before + 0.5)


def test_moco_head_bn_centres_a_shared_offset_and_is_off_by_default():
    """MoCo-v2's head has no BatchNorm (official); ``head_bn`` puts one after the hidden layer, so features
    that share a large offset (post-ReLU features of a random init) reach the head's output spread out."""
    torch.manual_seed(0)
    plain = MoCoV2(_tiny_backbone(), MoCoV2Config(hidden_dim=16, bank_size=16))
    with_bn = MoCoV2(_tiny_backbone(), MoCoV2Config(hidden_dim=16, bank_size=16, head_bn=True))
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in plain.head.modules())
    assert [type(m) for m in with_bn.head.modules() if isinstance(m, torch.nn.BatchNorm1d)] == [
        torch.nn.BatchNorm1d]
    f = 10 + 0.1 * torch.randn(64, plain.backbone.feature_dim)  # one direction plus a little spread
    assert feature_std(with_bn.head(f)).item() > 5 * feature_std(plain.head(f)).item()


@pytest.mark.parametrize("head_bn", [False, True])
def test_moco_head_layers_counts_the_heads_linear_layers_and_two_is_moco_v2s(head_bn):
    """``head_layers`` (issue 38's experiment): the head is that many linear layers, f -> hidden ... -> out
    with a ReLU (and with ``head_bn`` a BatchNorm) after each hidden one; the default 2 is MoCo-v2's head,
    parameter for parameter, so checkpoints and resumed runs from before the setting load unchanged."""
    def layers(head):
        return [(m.in_features, m.out_features) for m in head.modules() if isinstance(m, torch.nn.Linear)]

    cfg = MoCoV2Config(hidden_dim=16, out_dim=8, bank_size=16, head_bn=head_bn)
    two = MoCoV2(_tiny_backbone(), cfg)
    three = MoCoV2(_tiny_backbone(), MoCoV2Config(hidden_dim=16, out_dim=8, bank_size=16, head_bn=head_bn,
                                                  head_layers=3))
    f = two.backbone.feature_dim
    assert MoCoV2Config().head_layers == 2 and layers(two.head) == [(f, 16), (16, 8)]
    assert layers(three.head) == [(f, 16), (16, 16), (16, 8)] == layers(three.key_head)
    relus = [m for m in three.head.modules() if isinstance(m, torch.nn.ReLU)]
    norms = [m for m in three.head.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    assert len(relus) == 2 and len(norms) == (2 if head_bn else 0)
    if not head_bn:  # MoCo-v2's head as lightly builds it, state-dict key for key
        from lightly.models.modules import MoCoProjectionHead

        assert two.head.state_dict().keys() == MoCoProjectionHead(f, 16, 8).state_dict().keys()
    with pytest.raises(ValueError, match="head_layers"):
        MoCoV2Config(head_layers=1)


def test_uniformity_equals_the_pairwise_mean_and_is_zero_for_one_direction():
    """Wang & Isola's uniformity (eq. 5) against a loop over the ordered pairs; rows sharing one direction
    (any lengths) give log 1 = 0, its maximum; opposite unit rows give log exp(-2 * 4) = -8."""
    x = torch.randn(9, 5, generator=torch.Generator().manual_seed(0))
    u = F.normalize(x, dim=1)
    pairs = [math.exp(-2 * float((u[i] - u[j]).pow(2).sum())) for i in range(9) for j in range(9) if i != j]
    assert uniformity(x).item() == pytest.approx(math.log(sum(pairs) / len(pairs)), rel=1e-5)
    assert uniformity(torch.rand(6, 1).add(0.1) * torch.ones(6, 4)).item() == pytest.approx(0.0, abs=1e-5)
    assert uniformity(torch.tensor([[1.0, 0.0], [-3.0, 0.0]])).item() == pytest.approx(-8.0, abs=1e-5)


@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_moco_feature_uniformity_adds_its_weighted_term_and_is_off_by_default(weight):
    """feature_uniformity (issue 38): the loss is InfoNCE plus the weight times the uniformity of the
    backbone's features of the first view; 0, the default, is MoCo-v2's loss bit for bit."""
    assert MoCoV2Config().feature_uniformity == 0.0
    torch.manual_seed(0)
    method = MoCoV2(_tiny_backbone(), MoCoV2Config(hidden_dim=8, bank_size=16, feature_uniformity=weight))
    views = torch.randn(2, 4, 3, 32, 32)
    bank = method.extra_state()
    loss, _ = method(views)
    method.load_extra_state(bank)  # the bank as the forward read it
    h = method.backbone(views[0])
    expected = method.loss(method.head(h), method._keys(views[1])) + weight * uniformity(h)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_moco_symmetric_loss_is_the_mean_of_both_directions_against_the_same_bank():
    """symmetric (issue 38; MoCo v3's symmetrised loss): view 1's query against view 2's key and view 2's
    query against view 1's key, each against the bank as the step found it, averaged; both key sets enter
    the bank after, view 2's first. Off by default, where the loss is one direction."""
    assert MoCoV2Config().symmetric is False
    torch.manual_seed(0)
    method = MoCoV2(_tiny_backbone(), MoCoV2Config(hidden_dim=8, bank_size=16, symmetric=True))
    with torch.no_grad():  # a key encoder apart from the query's, so that the two directions differ
        for p in method.key_head.parameters():
            p.normal_()
    views = torch.randn(2, 4, 3, 32, 32)
    before = method.extra_state()
    loss, _ = method(views)
    after = method.extra_state()
    negatives, t = before["bank"], method.cfg.temperature
    with torch.no_grad():
        q1, q2 = (method.head(method.backbone(v)) for v in views)
        k1, k2 = (method._keys(v) for v in views)
    one_way = info_nce(q1, k2, negatives, t)
    expected = (one_way + info_nce(q2, k1, negatives, t)) / 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert abs(loss.item() - one_way.item()) > 1e-4  # the second direction counts
    written = torch.cat((k2, k1))
    assert torch.allclose(after["bank"][:8], F.normalize(written, dim=1), atol=1e-6)
    assert int(after["bank_ptr"]) == 8


def test_in_groups_normalises_each_group_on_its_own_and_interleaves_on_request():
    """in_groups (shuffled BN on one process): each group is its own BatchNorm batch, contiguous blocks or
    the residues mod the group count, outputs in the input's order; a batch too short for two rows a
    group is split into fewer; one group is the plain call."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(3).train()
    x = torch.randn(8, 3) * 3 + 1
    blocks, interleaved = in_groups(bn, x, 2), in_groups(bn, x, 2, interleave=True)
    assert torch.allclose(blocks[:4], bn(x[:4])) and torch.allclose(blocks[4:], bn(x[4:]))
    assert torch.allclose(interleaved[0::2], bn(x[0::2])) and torch.allclose(interleaved[1::2], bn(x[1::2]))
    assert not torch.allclose(blocks, bn(x), atol=1e-3)  # the groups' statistics differ from the batch's
    assert torch.allclose(in_groups(bn, x[:3], 2), bn(x[:3]))  # 3 rows: one group
    assert torch.allclose(in_groups(bn, x[:6], 3, interleave=True)[0::3], bn(x[:6][0::3]))
    assert torch.equal(in_groups(bn, x, 1), bn(x))


@pytest.mark.parametrize("splits", [1, 4])
def test_moco_bn_splits_keep_a_key_apart_from_all_but_its_own_group(splits):
    """bn_splits (issue 38; He et al. 2020, §3.3, emulated on one process): with 4 splits of 16 rows, key 0
    is made in a BN batch of rows 0, 4, 8, 12 and query 0 in one of rows 0-3, so another row's image moves
    them only when it is in that group; with 1 (the default) every row moves every key and query."""
    assert MoCoV2Config().bn_splits == 1
    torch.manual_seed(0)
    method = MoCoV2(_tiny_backbone(), MoCoV2Config(hidden_dim=8, bank_size=16, bn_splits=splits))
    x = torch.randn(16, 3, 32, 32)

    def moved(encode, row):
        y = x.clone()
        y[row] = torch.randn(3, 32, 32)
        with torch.no_grad():
            return not torch.allclose(encode(x)[0], encode(y)[0], atol=1e-6)

    def query(v):
        return in_groups(lambda c: method.head(method.backbone(c)), v, splits)

    assert moved(method._keys, 4) and moved(query, 1)  # in the group
    assert moved(method._keys, 1) == (splits == 1) and moved(query, 4) == (splits == 1)
    views = torch.stack((x, torch.randn_like(x)))  # the step's loss is made of these queries and keys
    bank = method.extra_state()["bank"]
    loss, _ = method(views)
    with torch.no_grad():
        expected = info_nce(query(views[0]), method._keys(views[1]), bank, method.cfg.temperature)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_feature_std_signals_collapse():
    assert feature_std(torch.ones(8, 4) * 3).item() == pytest.approx(0.0, abs=1e-7)
    eye = torch.eye(4).repeat(2, 1)  # rows spread over the axes: std of a column of [1,0,0,0]x2
    assert feature_std(eye).item() == pytest.approx(torch.tensor([1.0, 0, 0, 0] * 2).std().item())


@pytest.mark.parametrize("name", ["multilabel", "supervised"])
def test_classification_losses_with_a_zero_head(name):
    torch.manual_seed(0)
    method = METHODS[name](_tiny_backbone(), METHODS[name].Config(), N_CLASSES)
    torch.nn.init.zeros_(method.head.weight)
    torch.nn.init.zeros_(method.head.bias)
    views = torch.randn(1, 4, 3, 32, 32)
    loss, _ = method(views, _labels(METHODS[name], 4, torch.Generator().manual_seed(0)))
    # zero logits: BCE is log 2 per output; cross-entropy is log C
    assert loss.item() == pytest.approx(math.log(2) if name == "multilabel" else math.log(N_CLASSES))


def test_simsiam_predictor_keeps_a_fixed_lr_group():
    method = SimSiam(_tiny_backbone(), SimSiamConfig(proj_dim=16, pred_dim=8))
    groups = method.param_groups()
    assert [g["fixed_lr"] for g in groups] == [False, True]
    assert sum(len(g["params"]) for g in groups) == len(list(method.parameters()))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_lowers_its_loss_on_a_fixed_batch(name):
    torch.manual_seed(0)
    cls = METHODS[name]
    small = {"simsiam": {"proj_dim": 64, "pred_dim": 16}, "mocov2": {"hidden_dim": 64, "bank_size": 512}}
    method = cls(_tiny_backbone(), cls.Config(**small.get(name, {})), N_CLASSES)
    gen = torch.Generator().manual_seed(1)
    views = torch.randn(cls.n_views, 16, 3, 32, 32, generator=gen)
    labels = _labels(cls, 16, gen)
    opt = torch.optim.SGD(method.parameters(), lr=0.05, momentum=0.9)
    # MoCo's bank would fill with copies of this batch's keys, i.e. with positives posing as negatives;
    # holding it fixed makes the batch (and its negatives) truly fixed.
    extra = method.extra_state()
    losses = []
    for _ in range(8):
        method.load_extra_state(extra)
        loss, stats = method(views, labels)
        assert torch.isfinite(loss) and all(torch.isfinite(v) for v in stats.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        method.after_step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("keep", ["query", "key"])
def test_moco_checkpoint_and_signals_describe_the_kept_encoder(tmp_path, keep):
    """``keep=key`` ships the momentum encoder: the checkpoint holds the key backbone of the training state,
    not the query's, and its cosine to init is the key's; ``keep=query`` (the MoCo reference) the reverse.
    A fast momentum (0.5) makes the two encoders differ after a few steps."""
    from fpsfl.base.checkpoint import load_checkpoint, load_weights_only
    from pretrain.recipe import PretrainConfig, RunOptions
    from pretrain.signals import weight_drift
    from pretrain.train import build_method, train

    args = {"hidden_dim": 16, "bank_size": 32, "key_momentum": 0.5, "keep": keep}
    cfg = PretrainConfig(source="fps", method="mocov2", method_args=args, arch="resnet20", width=0.25,
                         size=16, batch_size=8, pairs_per_epoch=24, epochs=1)
    opts = RunOptions(out=tmp_path / "m.ckpt", run_dir=tmp_path / "m.run", device="cpu", workers=0,
                      progress=False)
    train(cfg, opts)
    ckpt = load_checkpoint(opts.out)
    model = load_weights_only(opts.run_dir / "state.pt", "state", ValueError)["model"]
    encoders = {name: {k.removeprefix(f"{name}."): v for k, v in model.items() if k.startswith(f"{name}.")}
                for name in ("backbone", "key_backbone")}
    kept, other = ("key_backbone", "backbone") if keep == "key" else ("backbone", "key_backbone")
    assert ckpt["backbone"].keys() == encoders[kept].keys()
    assert all(torch.equal(v, encoders[kept][k]) for k, v in ckpt["backbone"].items())
    assert not torch.equal(ckpt["backbone"]["conv1.weight"], encoders[other]["conv1.weight"])
    init = build_method(cfg, None, torch.device("cpu")).backbone.state_dict()
    # the same function of the same tensors: equal exactly (a few steps move the weights by ~1e-7 only)
    assert ckpt["signals"]["drift"] == weight_drift(init, encoders[kept])
    assert ckpt["signals"]["drift"] != weight_drift(init, encoders[other])


def test_methods_keep_their_trained_backbone_unless_told():
    method = SimSiam(_tiny_backbone(), SimSiamConfig())
    assert method.kept_backbone() is method.backbone
    moco = MoCoV2(_tiny_backbone(), MoCoV2Config(keep="key"))
    assert moco.kept_backbone() is moco.key_backbone is not moco.backbone


def _views_of(method_name: str, **settings):
    cls = METHODS[method_name]
    return cls(_tiny_backbone(), cls.Config(**settings), N_CLASSES).augment


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_augments_as_its_class_says_by_default(name):
    """Runs made before the views were settable trained on the class's augmentation: the default settings
    must give it exactly (MoCo-v2's for the self-supervised methods, crop + flip for the classifiers)."""
    from fpsfl.base.images import AugmentConfig
    from pretrain.methods.base import CROP_FLIP

    cls = METHODS[name]
    expected = AugmentConfig() if cls.labels is None else CROP_FLIP
    assert cls.augment == expected and _views_of(name) == expected


@pytest.mark.parametrize("name", [n for n in sorted(METHODS) if issubclass(METHODS[n].Config, ViewsConfig)])
def test_view_settings_reach_the_augmentation(name):
    views = _views_of(name, crop_min=0.5, jitter=2.0, jitter_p=0.1, grayscale_p=0.0, blur_p=1.0, flip_p=0.0)
    assert views.crop_scale == (0.5, 1.0) and views.jitter == pytest.approx((0.8, 0.8, 0.8, 0.2))
    assert (views.jitter_p, views.grayscale_p, views.blur_p, views.flip_p) == (0.1, 0.0, 1.0, 0.0)


def test_views_without_augmentation_are_the_same_image():
    """With every random transform off and crops of the whole image, a pair's two views are equal; with the
    defaults they differ (the test can fail both ways)."""
    from fractals.stream import augment_views

    renders = torch.randint(0, 256, (1, 4, 16, 16, 3), generator=torch.Generator().manual_seed(0),
                            dtype=torch.uint8)
    off = _views_of("mocov2", crop_min=1.0, jitter_p=0.0, grayscale_p=0.0, blur_p=0.0, flip_p=0.0)
    for cfg, same in ((off, True), (_views_of("mocov2"), False)):
        views = augment_views(renders, 2, cfg, torch.Generator().manual_seed(1))
        assert torch.equal(views[0], views[1]) is same


def test_a_bad_view_setting_is_a_one_line_error(capsys):
    from pretrain.cli import main

    assert main(["fps", "--set", "crop_min=0", "--epochs", "1", "--pairs-per-epoch", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "crop_min" in err and "(0, 1]" in err and "\n" not in err
