"""``nxrt compile``: save compiled partitions as ONNX Runtime-style EPContext nodes.

The model is partitioned and compiled by the session-creation pipeline; each compiled claim
whose EP can save it becomes one ``com.microsoft::EPContext`` node, every
other node stays as it was. The input model is never touched and the output
is written atomically (a temporary file in the same folder, then a rename).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import onnx
from onnx import helper

from nxrt._files import write_atomically
from nxrt.epcontext import EPCONTEXT_DOMAIN, EPCONTEXT_OP, EpContext, context_attributes
from nxrt.errors import InvalidArgument
from nxrt.pipeline.model import read_proto

SDK_METADATA_PREFIX = "ep_compatibility_info."


@dataclass
class CompileReport:
    """What ``compile_model`` wrote: one line per partition, saved or left as nodes."""

    output: str
    saved: list[tuple[str, str, int]] = field(default_factory=list)  # (partition, ep, nodes)
    not_saved: list[tuple[str, str, str]] = field(default_factory=list)  # (partition, ep, why)
    side_files: list[str] = field(default_factory=list)


def compile_model(
    model_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    providers: Sequence[str],
    *,
    embed_mode: int = 1,
    plugin_manager: Any = None,
) -> CompileReport:
    """Compile ``model_path`` for ``providers`` and write the context model to ``output_path``.

    :param embed_mode: 1 puts each blob inside the model; 0 writes it to a
        file next to ``output_path`` and records the file's name.
    """
    from nxrt import default_plugin_manager
    from nxrt.pipeline import stages as pipeline

    source, output = os.path.abspath(model_path), os.path.abspath(output_path)
    if embed_mode not in (0, 1):
        raise InvalidArgument(f"embed_mode must be 0 or 1, not {embed_mode!r}")
    if os.path.exists(output) and os.path.samefile(source, output):
        raise InvalidArgument("the output path is the input model; choose another file name")
    # Compile the graph as the model has it, so uncompiled nodes are written back unchanged.
    state = pipeline.create(
        source,
        pipeline.provider_requests(list(providers)),
        pipeline.CreateOptions(optimize=False),
        plugin_manager or default_plugin_manager(),
    )
    proto = read_proto(source)
    if any(t.HasField("data_location") and t.data_location for t in proto.graph.initializer):
        proto = onnx.load(source)  # external data comes along inside the output
    report = CompileReport(output)
    replaced: dict[str, onnx.NodeProto] = {}  # first output of a claimed node -> its EPContext
    claimed: set[str] = set()
    for claim, ep, owner, kernel in state.compiled_partitions():
        context = state.host.save_context(ep, owner, claim, kernel)
        if context is None:
            report.not_saved.append((claim.name, ep.id, "the EP does not save contexts"))
            continue
        node = _context_node(context, claim.name, output, embed_mode, report)
        firsts = [cast(str, n.outputs[0].name) for n in claim.nodes]
        replaced[firsts[0]] = node
        claimed.update(firsts)
        report.saved.append((claim.name, ep.id, len(claim.nodes)))
        key = SDK_METADATA_PREFIX + ep.id
        info = f"{context.ep_sdk_version};{context.hardware_architecture}"
        _set_metadata(proto, key, info)
    nodes = []
    for node in proto.graph.node:
        first = node.output[0] if node.output else ""
        if first in replaced:
            nodes.append(replaced[first])
        elif first not in claimed:
            nodes.append(node)
    del proto.graph.node[:]
    proto.graph.node.extend(_topological(nodes, proto.graph))
    _drop_unused_initializers(proto.graph)
    if replaced and not any(o.domain == EPCONTEXT_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(EPCONTEXT_DOMAIN, 1))
    write_atomically(output, proto.SerializeToString())
    return report


def _context_node(
    context: EpContext, name: str, output: str, embed_mode: int, report: CompileReport
) -> onnx.NodeProto:
    context.partition_name = context.partition_name or name
    context.embed_mode = embed_mode
    context.onnx_model_filename = context.onnx_model_filename or os.path.basename(output)
    blob: bytes = context.ep_cache_context
    if embed_mode == 0:
        stem = os.path.splitext(os.path.basename(output))[0]
        side = f"{stem}_{context.partition_name}.ctx"
        write_atomically(os.path.join(os.path.dirname(output), side), blob)
        report.side_files.append(side)
        blob = side.encode()
    attrs = context_attributes(context, blob)
    return helper.make_node(
        EPCONTEXT_OP,
        context.inputs,
        context.outputs,
        name=context.partition_name,
        domain=EPCONTEXT_DOMAIN,
        **attrs,
    )


def _topological(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes in an order where each comes after what it reads (stable otherwise)."""
    available = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(nodes)
    order: list[onnx.NodeProto] = []
    while pending:
        progress = False
        rest = []
        for node in pending:
            if all(name in available for name in node.input):
                order.append(node)
                available.update(node.output)
                progress = True
            else:
                rest.append(node)
        pending = rest
        if not progress:  # outer-scope or unresolvable names: keep the remaining order
            order.extend(pending)
            break
    return order


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Weights only compiled partitions read now travel in their blobs."""
    used = {name for node in graph.node for name in node.input}
    used |= {v.name for v in graph.output} | _subgraph_reads(graph)
    dropped = {t.name for t in graph.initializer if t.name not in used}
    keep = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    inputs = [v for v in graph.input if v.name not in dropped]
    del graph.input[:]
    graph.input.extend(inputs)


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                names |= {name for n in sub.node for name in n.input} | _subgraph_reads(sub)
    return names


def _set_metadata(proto: onnx.ModelProto, key: str, value: str) -> None:
    for entry in proto.metadata_props:
        if entry.key == key:
            entry.value = value
            return
    proto.metadata_props.add(key=key, value=value)
