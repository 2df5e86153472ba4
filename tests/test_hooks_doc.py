"""The hook contract is executable: docs/hooks.md is generated, and what it says is checked.

``scripts/make_hooks_doc.py`` renders the reference from ``nxrt.hookspecs``
and the shipped plugins; these tests fail when the committed file is stale,
when a hookspec's docstring lacks a section, and when sessions stop calling
the hooks in the order the hookspecs' module docstring numbers.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt
from nxrt import hookspecs
from nxrt.tools.compile import compile_model
from nxrt.tools.testing import register_plugin
from toy_plugin import ToyPlugin

ROOT = Path(__file__).resolve().parent.parent


def load_generator():
    path = ROOT / "scripts" / "make_hooks_doc.py"
    spec = importlib.util.spec_from_file_location("make_hooks_doc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = load_generator()


def test_docs_hooks_md_is_the_generated_reference():
    want = gen.generate()
    have = gen.DOC.read_text(encoding="utf-8") if gen.DOC.exists() else ""
    assert have == want, "docs/hooks.md is stale: run `python scripts/make_hooks_doc.py`"


def test_every_hookspec_is_in_the_reference():
    names = [fn.__name__ for fn in gen.hookspecs()]
    assert sorted(names) == sorted(hookspecs.__all__)
    text = gen.DOC.read_text(encoding="utf-8")
    assert all(f"## {name}\n" in text for name in names)


def test_every_hookspec_docstring_has_every_section():
    assert gen.check_docstrings(gen.hookspecs()) == []


COMPLETE = """\
    Do one thing.

    Called once per session.

    :param ep: The EP.
    :param node: The node.

    :returns: An answer, or ``None``.

    Stops at the first non-``None`` result.

    Ownership: the host asks only the plugin that registered ``ep``.

    If this hook raises, the failure is recorded.
"""

SECTIONS = {
    "when called": "    Called once per session.\n",
    "params": "    :param node: The node.\n",
    "returns": "    :returns: An answer, or ``None``.\n",
    "firstresult": "    Stops at the first non-``None`` result.\n",
    "ownership": "    Ownership: the host asks only the plugin that registered ``ep``.\n",
    "failure": "    If this hook raises, the failure is recorded.\n",
}


def make_spec(doc: str, firstresult: bool = True):
    def nxrt_example(ep, node):
        pass

    nxrt_example.__doc__ = doc
    return hookspecs.hookspec(firstresult=firstresult)(nxrt_example)


def test_a_complete_docstring_passes_the_section_check():
    assert gen.missing_sections(make_spec(COMPLETE)) == []


@pytest.mark.parametrize("section", SECTIONS)
def test_a_hookspec_missing_a_section_is_named(section):
    assert SECTIONS[section] in COMPLETE
    missing = gen.missing_sections(make_spec(COMPLETE.replace(SECTIONS[section], "")))
    assert [m.split(" ", 1)[0] for m in missing] == [section.split()[0]], missing


def test_the_firstresult_sentence_must_match_the_flag():
    (problem,) = gen.missing_sections(make_spec(COMPLETE, firstresult=False))
    assert problem.startswith("firstresult")


def test_a_hand_written_implemented_by_line_is_refused():
    doc = COMPLETE + "\n    Implemented by: cpu.\n"
    assert gen.missing_sections(make_spec(doc)) == [
        "no hand-written 'Implemented by' (it is derived from the plugins)"
    ]


def test_implemented_by_comes_from_the_plugins_pluggy_loaded():
    plugins = gen.shipped_plugins()
    folders = {p.parent.name for p in (ROOT / "plugins").glob("*/pyproject.toml")}
    assert {Path(inspect.getfile(p)).parent.parent.name for p in plugins.values()} == folders
    by_hook = gen.implementers(plugins)
    assert by_hook["nxrt_register"] == sorted(plugins)  # every plugin registers its EPs
    text = gen.render(gen.hookspecs(), {"nxrt_register": ["someone"]})
    assert "Implemented by: someone." in text
    assert "Implemented by: none of the shipped plugins." in text


# -- the documented order is the order sessions call the hooks ----------------------------------


def documented_order() -> list[str]:
    """The hook named by each numbered step (and sub-step) of the hookspecs' module docstring."""
    doc = textwrap.dedent(hookspecs.__doc__ or "")
    return re.findall(r"^\s*(?:\d+\.|-) ``(nxrt_\w+)\(", doc, re.MULTILINE)


def test_the_module_docstring_numbers_every_hook():
    assert set(documented_order()) == set(hookspecs.__all__)


def context_model():
    """x -> EPContext(toy_ctx: Relu) -> r; Add(c1, c2) folds; Relu(Add(r, c)) -> y."""
    context = helper.make_node(
        "EPContext",
        ["x"],
        ["r"],
        name="ctx",
        domain="com.microsoft",
        source="toy_ctx",
        ep_cache_context=b"Relu",
        embed_mode=1,
        main_context=1,
    )
    nodes = [
        helper.make_node("Add", ["c1", "c2"], ["c"], name="fold"),
        context,
        helper.make_node("Add", ["r", "c"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    weights = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in ("c1", "c2")]
    graph = helper.make_graph(
        nodes,
        "ctx",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        weights,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def test_sessions_call_the_hooks_in_the_documented_order(nxrt_pm, hook_recorder, tmp_path):
    *creation, save, warmup = documented_order()
    assert warmup == "nxrt_warmup"  # only `nxrt warmup` calls it, never a session
    # The toy EP claims "add" and matches "relu" on its own, so step 6 has both hooks.
    plugin = ToyPlugin(
        claims=True, context=True, claim_picker=lambda nodes: [n for n in nodes if n.name == "add"]
    )
    with register_plugin(nxrt_pm, plugin, "toy"):
        session = nxrt.InferenceSession(context_model(), providers=["toy"], plugin_manager=nxrt_pm)
        (y,) = session.run(None, {"x": np.array([-1, 3], np.float32)})
        np.testing.assert_array_equal(y, [2, 5])
        assert session.get_partition().folded, "the constant Add should have been folded"
        assert hook_recorder.names() == creation  # one EP: step 6 runs once

        hook_recorder.calls_made.clear()
        source, out = tmp_path / "plain.onnx", tmp_path / "compiled.onnx"
        plain = helper.make_model(
            helper.make_graph(
                [helper.make_node("Add", ["x", "x"], ["y"], name="add")],
                "plain",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
            ),
            opset_imports=[helper.make_opsetid("", 17)],
        )
        source.write_bytes(plain.SerializeToString())
        compile_model(source, out, ["toy"], plugin_manager=nxrt_pm)
    assert hook_recorder.names()[-1] == save
    assert hook_recorder.names().count(save) == 1
