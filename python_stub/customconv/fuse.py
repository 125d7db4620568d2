"""customconv.fuse(model): an eval-mode model's convolutions fused with the
BatchNorm2d, residual add and activation that follow them, as
customconv.nn.FusedConv2d modules (one customconv::conv2d_fused call each)."""

import copy
import dataclasses
import operator
from typing import Dict, List, Optional, Tuple

import torch
import torch.fx
import torch.nn.functional as F

from . import nn
from .convert import convert

__all__ = ["fuse", "fuse_report", "FuseReport"]

# Convolution modules fuse folds (exactly these types: a subclass may compute
# something else in its forward).
_CONV_TYPES = (torch.nn.Conv2d, nn.Conv2d, nn.DepthwiseConv2d)
_BN_TYPES = (torch.nn.BatchNorm2d, torch.nn.SyncBatchNorm)
# customconv's modules stay whole in the traced graph, as torch.nn's do.
_LEAF_TYPES = (nn.Conv2d, nn.DepthwiseConv2d, nn.FusedConv2d, nn.Filter2d,
               nn.TrilinearInterpolation)

# Activation functions and methods as torch.fx records them: the kind, and the
# names of the positional arguments after the input.
_ACTIVATION_FUNCTIONS = {
    F.relu: ("relu", ("inplace",)),
    torch.relu: ("relu", ()),
    torch.relu_: ("relu", ()),
    F.relu6: ("relu6", ("inplace",)),
    F.silu: ("silu", ("inplace",)),
    F.hardswish: ("hardswish", ("inplace",)),
    F.gelu: ("gelu", ("approximate",)),
    torch.sigmoid: ("sigmoid", ()),
    torch.sigmoid_: ("sigmoid", ()),
    F.sigmoid: ("sigmoid", ()),
    F.hardtanh: ("hardtanh", ("min_val", "max_val", "inplace")),
    F.hardtanh_: ("hardtanh", ("min_val", "max_val")),
}
_ACTIVATION_METHODS = {"relu": "relu", "relu_": "relu", "sigmoid": "sigmoid", "sigmoid_": "sigmoid"}
_ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add)


@dataclasses.dataclass
class FuseReport:
    """What customconv.fuse did to a model (str(report) is fused.fuse_summary).

    method:             "torch.fx" or "module patterns" (torch.fx could not
                        trace the model: trace_error says why)
    fused:              (name, what) of every FusedConv2d made, e.g.
                        ("layer1.0.conv2", "conv + bn + add + relu")
    batchnorms_folded:  BatchNorm2d layers folded into a convolution
    activations_fused:  activations fused, by kind ("relu", "relu6", "silu", ...)
    residual_adds_fused: additions fused as the op's residual
    unfused_convs:      reason -> names of the convolutions left unfused (converted
                        to customconv.nn.Conv2d / DepthwiseConv2d where they were
                        torch.nn.Conv2d, else left as they were)
    batchnorms_left:    reason -> names of the BatchNorm2d layers still in the model
    noops_removed:      nodes removed as no-ops in eval mode (torch.nn.Identity,
                        torchvision's stochastic_depth outside training)
    """

    method: str = "torch.fx"
    trace_error: Optional[str] = None
    fused: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    batchnorms_folded: int = 0
    activations_fused: Dict[str, int] = dataclasses.field(default_factory=dict)
    residual_adds_fused: int = 0
    unfused_convs: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    batchnorms_left: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    noops_removed: int = 0

    @property
    def convs_fused(self) -> int:
        return len(self.fused)

    @property
    def convs_unfused(self) -> int:
        return sum(len(v) for v in self.unfused_convs.values())

    @property
    def batchnorms_remaining(self) -> int:
        return sum(len(v) for v in self.batchnorms_left.values())

    def _record(self, name: str, bn: bool, residual: bool, activation: str) -> None:
        parts = ["conv"] + (["bn"] if bn else []) + (["add"] if residual else [])
        if activation != "identity":
            parts.append(activation)
            self.activations_fused[activation] = self.activations_fused.get(activation, 0) + 1
        self.fused.append((name, " + ".join(parts)))
        self.batchnorms_folded += int(bn)
        self.residual_adds_fused += int(residual)

    def __str__(self) -> str:
        def names(v: List[str]) -> str:
            shown = ", ".join(v[:4])
            return shown + (f", ... ({len(v) - 4} more)" if len(v) > 4 else "")

        how = "torch.fx graph" if self.method == "torch.fx" else (
            "module patterns in torch.nn.Sequential containers (torch.fx could not trace "
            f"the model: {self.trace_error}); residual adds are not fused this way")
        acts = ", ".join(f"{k} {v}" for k, v in sorted(self.activations_fused.items()))
        lines = [
            f"customconv.fuse: {how}",
            f"  convolutions fused:            {self.convs_fused}",
            f"  BatchNorm2d folded:            {self.batchnorms_folded}",
            f"  activations fused:             {sum(self.activations_fused.values())}"
            + (f" ({acts})" if acts else ""),
            f"  residual adds fused:           {self.residual_adds_fused}",
            f"  convolutions left unfused:     {self.convs_unfused}",
        ]
        for reason, v in self.unfused_convs.items():
            lines.append(f"    {len(v)} {reason}: {names(v)}")
        lines.append(f"  BatchNorm2d left:              {self.batchnorms_remaining}")
        for reason, v in self.batchnorms_left.items():
            lines.append(f"    {len(v)} {reason}: {names(v)}")
        if self.noops_removed:
            lines.append(f"  no-op nodes removed:           {self.noops_removed}")
        return "\n".join(lines)


def fuse(model: torch.nn.Module, *, inplace: bool = False,
         memory_format="auto") -> torch.nn.Module:
    """An inference copy of the eval-mode `model` whose convolutions are
    customconv.nn.FusedConv2d modules doing, in one customconv::conv2d_fused
    call, what the layers after them did:

        Conv2d -> [BatchNorm2d] -> [+ residual] -> [activation]

    - BatchNorm2d (eval, with running statistics) is folded into the weight and
      bias (in float64, then rounded to the weight's dtype; memory format and
      device kept);
    - an addition of another tensor (operator.add, torch.add, Tensor.add,
      x += y) is fused as the op's residual, when the convolution's (or the
      BatchNorm's) output goes nowhere else (a number or a parameter is no
      residual; a tensor that turns out not to have the output's shape, a
      broadcast add the graph alone does not tell, is added after the
      convolution by FusedConv2d instead, with the same result);
    - an activation, as a module (ReLU, ReLU6, SiLU, Hardswish, GELU
      (approximate="none"), Sigmoid, Hardtanh(0, 6)), a function (F.relu,
      torch.relu, F.relu6, F.silu, F.hardswish, F.gelu, torch.sigmoid,
      F.sigmoid, F.hardtanh(x, 0, 6), in-place forms too) or a method
      (.relu(), .sigmoid(), .relu_(), .sigmoid_()), when the value before it
      goes nowhere else. An activation before the add (conv -> bn -> relu ->
      add) is fused, the add is not.

    The convolutions are torch.nn.Conv2d (exactly that type) or customconv's
    Conv2d / DepthwiseConv2d, with any padding and padding_mode. Every
    torch.nn.Conv2d that is left unfused becomes customconv's (customconv.convert).

    The model is traced with torch.fx (customconv's modules and torch.nn's are
    leaves) and a torch.fx.GraphModule is returned. Where torch.fx cannot trace
    the model (Python control flow on tensors, ...), module patterns are fused
    instead: in every torch.nn.Sequential, a convolution followed by a
    BatchNorm2d and/or an activation module becomes one FusedConv2d (the others
    torch.nn.Identity), and the patched model is returned.

    memory_format: the layout of the convolutions' weights in the result, which
    (F.conv2d's rule) sets the layout of their outputs. "auto" (the default),
    for a model whose convolutions are on a CUDA device, or all on the CPU in
    float32: channels_last, since the GPU's implicit-GEMM kernels (which apply
    the epilogue in the kernel), the CPU's direct float32 kernels and both
    devices' depthwise kernels read channels_last data in place (an NCHW input
    is taken as it is; the first convolution's output is channels_last, and
    from there on no layer changes layouts). Otherwise (other CPU dtypes,
    mixed devices) "auto" keeps the weights as they are. The model's outputs
    keep their values either way. torch.channels_last or torch.contiguous_format
    forces one layout; None keeps the weights as they are.

    With inplace=True the model is not copied first: the result shares its
    modules and parameters, and where torch.fx cannot trace the model, the
    result is the model itself, patched.

    The result scripts (torch.jit.script, where the model did), exports
    (torch.export.export) and keeps the model's devices and dtypes.
    `fused.fuse_summary` is a printable report of what was fused and what was
    left and why; customconv.fuse_report(fused) gives it as a FuseReport.

    Raises ValueError for a model in training mode (any submodule with
    .training set): folding BatchNorm uses its running statistics, which only
    eval mode does; call model.eval() first.
    """
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("customconv.fuse: fuse the torch.nn.Module, then script the result")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"customconv.fuse: expected a torch.nn.Module; got {type(model).__name__}")
    training = [name or type(model).__name__ for name, m in model.named_modules() if m.training]
    if training:
        shown = ", ".join(repr(n) for n in training[:3]) + (", ..." if len(training) > 3 else "")
        raise ValueError(
            f"customconv.fuse: the model is in training mode ({len(training)} module(s): {shown}). "
            "Fusing folds each BatchNorm2d's running statistics into the convolution's weight, "
            "which gives the model's outputs in eval mode only: call model.eval() before "
            "customconv.fuse(model).")
    if not inplace:
        model = copy.deepcopy(model)

    report = FuseReport()
    # A lone leaf (a bare Conv2d, say) would be traced into its functional form;
    # trace it as a module call instead.
    root = torch.nn.Sequential(model) if _Tracer().is_leaf_module(model, "") else model
    conv_names = [name for name, m in root.named_modules() if isinstance(m, torch.nn.Conv2d)]
    try:
        graph = _Tracer().trace(root)
        traced = torch.fx.GraphModule(root, graph, class_name=type(model).__name__)
    except Exception as e:  # noqa: BLE001  (any tracing failure: fall back to module patterns)
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        report.method, report.trace_error = "module patterns", f"{type(e).__name__}: {first_line}"
        result = _fuse_module_patterns(model, report)
    else:
        result = _fuse_graph(traced, report, conv_names)
    _set_weight_layout(result, memory_format)
    result.eval()
    result.fuse_summary = str(report)
    result._customconv_fuse_report = report
    if isinstance(result, torch.fx.GraphModule):
        # GraphModule's deepcopy rebuilds the module; these attributes survive it.
        key = getattr(torch.fx.graph_module, "_USER_PRESERVED_ATTRIBUTES_KEY", None)
        if key is not None:
            result.meta.setdefault(key, {}).update(
                fuse_summary=result.fuse_summary, _customconv_fuse_report=report)
    return result


def fuse_report(model: torch.nn.Module) -> FuseReport:
    """The FuseReport of a model made by customconv.fuse (str() of it is
    model.fuse_summary)."""
    report = getattr(model, "_customconv_fuse_report", None)
    if report is None:
        raise ValueError("customconv.fuse_report: this model was not made by customconv.fuse")
    return report


# ---------------------------------------------------------------- torch.fx


class _Tracer(torch.fx.Tracer):
    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return isinstance(m, _LEAF_TYPES) or super().is_leaf_module(m, qualname)


def _fuse_graph(gm: torch.fx.GraphModule, report: FuseReport,
                conv_names: List[str]) -> torch.fx.GraphModule:
    graph = gm.graph
    modules = dict(gm.named_modules())
    kept = {n.target for n in graph.nodes if n.op == "call_module"}
    for name in conv_names:
        if name not in kept:
            _add(report.unfused_convs, "traced into its functional form (not a module call in the "
                 "torch.fx graph: a subclass of torch.nn.Conv2d, or not called as a module)", name)
    report.noops_removed = _remove_noops(graph, modules)

    calls: Dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    bn_reasons: Dict[torch.fx.Node, str] = {}

    for node in list(graph.nodes):
        if node.op != "call_module" or not isinstance(modules.get(node.target), torch.nn.Conv2d):
            continue
        conv = modules[node.target]
        name = node.target
        reason = _conv_not_fusable(node, conv, calls)
        if reason is not None:
            _add(report.unfused_convs, reason, name)
            continue
        chain, bn, residual, activation, stop = _match_chain(node, conv, modules, bn_reasons)
        if len(chain) == 1:
            _add(report.unfused_convs, stop, name)
            continue
        fused = nn.FusedConv2d.from_conv(conv, bn, activation)
        _set_submodule(gm, name, fused)
        modules[name] = fused
        last = chain[-1]
        with graph.inserting_before(last):
            args = (node.args[0],) if residual is None else (node.args[0], residual)
            new = graph.call_module(name, args)
        new.meta = dict(last.meta)
        last.replace_all_uses_with(new)
        for n in reversed(chain):
            graph.erase_node(n)
        report._record(name, bn is not None, residual is not None, activation)

    for node in graph.nodes:
        if node.op == "call_module" and isinstance(modules.get(node.target), _BN_TYPES):
            reason = bn_reasons.get(node)
            if reason is None:
                reason = f"not after a convolution (after {_describe(node.args[0], modules)})"
            _add(report.batchnorms_left, reason, node.target)

    graph.lint()
    gm.delete_all_unused_submodules()
    convert(gm)
    gm.recompile()
    return gm


def _conv_not_fusable(node, conv, calls) -> Optional[str]:
    if type(conv) not in _CONV_TYPES:
        return (f"of type {type(conv).__name__} (fuse takes torch.nn.Conv2d exactly and "
                "customconv's Conv2d / DepthwiseConv2d)")
    if isinstance(conv.weight, torch.nn.parameter.UninitializedParameter):
        return "lazy, not initialized yet"
    if calls[node.target] > 1:
        return "called more than once (shared weights)"
    if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], torch.fx.Node):
        return "called with arguments other than one input tensor"
    return None


def _match_chain(conv_node, conv, modules, bn_reasons):
    """The nodes conv -> [bn] -> [add] -> [activation] that fuse into one
    FusedConv2d, the BatchNorm module, the residual node, the activation's kind
    and why the chain stops where it does."""
    chain, bn, residual, activation = [conv_node], None, None, "identity"
    tail = conv_node
    user = _sole_user(tail)

    if (user is not None and user.op == "call_module"
            and isinstance(modules.get(user.target), _BN_TYPES)):
        bn_module = modules[user.target]
        why = _bn_not_foldable(user, tail, bn_module, conv)
        if why is None:
            bn, tail = bn_module, user
            chain.append(user)
            user = _sole_user(tail)
        else:
            bn_reasons[user] = why
            stop = f"followed by a BatchNorm2d that cannot be folded ({why})"
            return chain, None, None, activation, stop
    elif len(tail.users) > 1:
        for u in tail.users:
            if u.op == "call_module" and isinstance(modules.get(u.target), _BN_TYPES):
                bn_reasons[u] = "after a convolution whose output has other users too"

    if user is not None:
        other = _residual_of_add(user, tail)
        if other is not None:
            residual, tail = other, user
            chain.append(user)
            user = _sole_user(tail)

    if user is not None:
        kind = _activation_of(user, tail, modules)
        if kind is not None:
            activation = kind
            chain.append(user)

    stop = ""
    if len(chain) == 1:
        if len(tail.users) == 0:
            stop = "whose output is not used"
        elif len(tail.users) > 1:
            stop = "whose output has several users"
        else:
            stop = f"followed by nothing fuse folds ({_describe(user, modules)})"
    return chain, bn, residual, activation, stop


def _sole_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _bn_not_foldable(bn_node, conv_node, bn, conv) -> Optional[str]:
    if bn_node.args != (conv_node,) or bn_node.kwargs:
        return "called with other arguments"
    return _bn_module_not_foldable(bn, conv)


def _bn_module_not_foldable(bn, conv) -> Optional[str]:
    if bn.running_mean is None or bn.running_var is None:
        return "without running statistics (track_running_stats=False)"
    if bn.num_features != conv.out_channels:
        return "with another number of features than the convolution has output channels"
    return None


def _residual_of_add(node, src) -> Optional[torch.fx.Node]:
    """The other operand of `node` if it is src + other (or other + src) of two
    tensors, else None."""
    if node.op == "call_function" and node.target in _ADD_FUNCTIONS:
        in_place = node.target is operator.iadd
    elif node.op == "call_method" and node.target in ("add", "add_"):
        in_place = node.target == "add_"
    else:
        return None
    if len(node.args) != 2:
        return None
    kwargs = dict(node.kwargs)
    alpha = kwargs.pop("alpha", 1)
    if kwargs or isinstance(alpha, torch.fx.Node) or alpha != 1:
        return None
    a, b = node.args
    if a is src and b is not src:
        other = b
    elif b is src and a is not src and not in_place:  # other.add_(src) writes into other
        other = a
    else:
        return None
    if not isinstance(other, torch.fx.Node) or other.op == "get_attr":
        return None  # a number or a parameter (a broadcast bias, most likely)
    return other


def _activation_of(node, src, modules) -> Optional[str]:
    """The kind of activation `node` applies to src (one of FusedConv2d's), or None."""
    if node.op == "call_module":
        if node.args != (src,) or node.kwargs:
            return None
        return _activation_of_module(modules.get(node.target))
    if node.op == "call_method":
        kind = _ACTIVATION_METHODS.get(node.target)
        return kind if node.args == (src,) and not node.kwargs else None
    if node.op != "call_function":
        return None
    try:
        entry = _ACTIVATION_FUNCTIONS.get(node.target)
    except TypeError:  # an unhashable target
        return None
    if entry is None or not node.args or node.args[0] is not src:
        return None
    kind, names = entry
    if len(node.args) - 1 > len(names):
        return None
    params = dict(zip(names, node.args[1:]))
    params.update(node.kwargs)
    if any(k not in names or isinstance(v, torch.fx.Node) for k, v in params.items()):
        return None
    if kind == "gelu" and params.get("approximate", "none") != "none":
        return None
    if kind == "hardtanh":
        low, high = params.get("min_val", -1.0), params.get("max_val", 1.0)
        return "relu6" if (low, high) == (0, 6) else None
    return kind


def _activation_of_module(m) -> Optional[str]:
    t = type(m)
    if t is torch.nn.ReLU:
        return "relu"
    if t is torch.nn.ReLU6:
        return "relu6"
    if t is torch.nn.Hardtanh:
        return "relu6" if (m.min_val, m.max_val) == (0, 6) else None
    if t is torch.nn.SiLU:
        return "silu"
    if t is torch.nn.Hardswish:
        return "hardswish"
    if t is torch.nn.GELU:
        return "gelu" if m.approximate == "none" else None
    if t is torch.nn.Sigmoid:
        return "sigmoid"
    return None


def _remove_noops(graph: torch.fx.Graph, modules) -> int:
    """Removes nodes that return their input in eval mode: torch.nn.Identity
    modules and torchvision's stochastic_depth(training=False)."""
    removed = 0
    for node in list(graph.nodes):
        source = None
        if node.op == "call_module" and type(modules.get(node.target)) is torch.nn.Identity:
            if len(node.args) == 1 and not node.kwargs:
                source = node.args[0]
        elif node.op == "call_function" and _is_stochastic_depth(node.target):
            args = list(node.args) + [None] * (4 - len(node.args))
            training = node.kwargs.get("training", args[3])
            if training is False:
                source = node.args[0] if node.args else node.kwargs.get("input")
        if isinstance(source, torch.fx.Node):
            node.replace_all_uses_with(source)
            graph.erase_node(node)
            removed += 1
    return removed


def _is_stochastic_depth(fn) -> bool:
    return (getattr(fn, "__name__", None) == "stochastic_depth"
            and str(getattr(fn, "__module__", "")).startswith("torchvision"))


def _describe(node, modules) -> str:
    if node is None:
        return "nothing"
    if not isinstance(node, torch.fx.Node):
        return type(node).__name__
    if node.op == "call_module":
        return type(modules[node.target]).__name__ if node.target in modules else str(node.target)
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "output":
        return "the model's output"
    return node.op


def _set_submodule(root: torch.nn.Module, qualname: str, module: torch.nn.Module) -> None:
    parent_name, _, name = qualname.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, name, module)


def _add(groups: Dict[str, List[str]], reason: str, name: str) -> None:
    names = groups.setdefault(reason, [])
    if name not in names:  # a module called at several places is listed once
        names.append(name)


# ---------------------------------------------------------------- module patterns


def _fuse_module_patterns(model: torch.nn.Module, report: FuseReport) -> torch.nn.Module:
    if type(model) in _CONV_TYPES:
        model = torch.nn.Sequential(model)  # a bare convolution: nothing follows it
    handled = set()
    for seq in list(model.modules()):
        if (not isinstance(seq, torch.nn.Sequential)
                or type(seq).forward is not torch.nn.Sequential.forward):  # a forward of its own
            continue
        names = list(seq._modules)
        prefix = _qualname(model, seq)
        i = 0
        while i < len(names):
            conv = seq._modules[names[i]]
            if type(conv) not in _CONV_TYPES or id(conv) in handled:
                i += 1
                continue
            handled.add(id(conv))
            qual = prefix + names[i]
            j = i + 1
            bn = None
            nxt = seq._modules[names[j]] if j < len(names) else None
            if isinstance(conv.weight, torch.nn.parameter.UninitializedParameter):
                _add(report.unfused_convs, "lazy, not initialized yet", qual)
                i += 1
                continue
            if isinstance(nxt, _BN_TYPES):
                why = _bn_module_not_foldable(nxt, conv)
                if why is not None:
                    handled.add(id(nxt))
                    _add(report.unfused_convs,
                         f"followed by a BatchNorm2d that cannot be folded ({why})", qual)
                    _add(report.batchnorms_left, why, prefix + names[j])
                    i += 1
                    continue
                bn, j = nxt, j + 1
                handled.add(id(nxt))
            act = _activation_of_module(seq._modules[names[j]]) if j < len(names) else None
            if act is not None:
                j += 1
            if bn is None and act is None:
                _add(report.unfused_convs,
                     "followed by nothing fuse folds in its torch.nn.Sequential", qual)
                i += 1
                continue
            seq._modules[names[i]] = nn.FusedConv2d.from_conv(conv, bn, act or "identity")
            for k in range(i + 1, j):
                seq._modules[names[k]] = torch.nn.Identity()
            report._record(qual, bn is not None, False, act or "identity")
            i = j
    for name, m in model.named_modules():
        if type(m) in _CONV_TYPES and id(m) not in handled:
            _add(report.unfused_convs, "not in a torch.nn.Sequential", name)
        elif isinstance(m, torch.nn.Conv2d) and type(m) not in _CONV_TYPES:
            _add(report.unfused_convs, f"of type {type(m).__name__}", name)
        elif isinstance(m, _BN_TYPES) and id(m) not in handled:
            _add(report.batchnorms_left, "not after a convolution in a torch.nn.Sequential", name)
    return convert(model)


def _qualname(root: torch.nn.Module, module: torch.nn.Module) -> str:
    for name, m in root.named_modules():
        if m is module:
            return name + "." if name else ""
    return ""


def _set_weight_layout(model: torch.nn.Module, memory_format) -> None:
    """Puts the 4-D weights of customconv's convolution modules in memory_format
    (see fuse)."""
    convs = [m for m in model.modules() if isinstance(m, (nn.FusedConv2d, nn.Conv2d))]
    if memory_format is None or not convs:
        return
    if memory_format == "auto":
        on_cuda = all(m.weight.is_cuda for m in convs)
        cpu_float32 = all(m.weight.device.type == "cpu" and m.weight.dtype == torch.float32 for m in convs)
        if not (on_cuda or cpu_float32):
            return
        memory_format = torch.channels_last
    elif memory_format not in (torch.channels_last, torch.contiguous_format):
        raise ValueError("customconv.fuse: memory_format must be 'auto', None, "
                         f"torch.channels_last or torch.contiguous_format; got {memory_format!r}")
    for m in convs:
        w = m.weight
        if w.dim() == 4:  # clone: a 1x1 weight is "contiguous" in both layouts, not its strides
            m.weight = torch.nn.Parameter(w.detach().clone(memory_format=memory_format),
                                          requires_grad=w.requires_grad)


