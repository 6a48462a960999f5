"""What a failed gate means: the common TFServing load, warmup and signature failures,
recognised from the server's own text, each with its cause and its fix (pure: text in, a
``Diagnosis`` or None out; nothing here talks to a host).

Each pattern matches the message the real server writes, as TFServing's and TensorFlow's
sources build it (the file is named beside each pattern); the testbed's TFServing-compatible
server writes the same messages. A failed gate hands over what it saw (the version's
GetModelStatus error, a container's exit) followed by the server's log: the first pattern, in
``PATTERNS`` order, found anywhere in that text wins, and the line it was found on is the
diagnosis's evidence. The signature gate's failures are diagnosed from the served metadata
instead (``diagnose_signature``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

EVIDENCE_CHARS = 300

TensorView = Mapping[str, tuple[str, tuple[int, ...]]]
"""Tensors of one side of a signature: name -> (dtype name, shape with -1 for any)."""
SignatureView = Mapping[str, TensorView]
"""One signature: ``{"inputs": TensorView, "outputs": TensorView}``."""


class Kind(StrEnum):
    """The failures recognised."""

    VARIABLES_NOT_RESTORED = "variables_not_restored"
    OP_NOT_IN_SERVER = "op_not_in_server"
    MODEL_NEWER_THAN_SERVER = "model_newer_than_server"
    GPU_MEMORY_EXHAUSTED = "gpu_memory_exhausted"
    GPU_POOL_CUT = "gpu_pool_cut"  # the process holds less than its planned pool (nvidia-smi)
    WARMUP_FILE_UNREADABLE = "warmup_file_unreadable"
    SIGNATURE_MISMATCH = "signature_mismatch"


@dataclass(frozen=True)
class Diagnosis:
    """Why a release failed and how to fix it, with the line it was recognised from."""

    kind: Kind
    cause: str
    fix: str
    evidence: str

    def lines(self) -> list[str]:
        """For people: ``cause: ...``, ``fix: ...``, ``evidence: ...``."""
        return [f"cause: {self.cause}", f"fix: {self.fix}", f"evidence: {self.evidence}"]

    def as_dict(self) -> dict[str, str]:
        """For the JSON result and the release record."""
        return {"kind": self.kind.value, "cause": self.cause, "fix": self.fix,
                "evidence": self.evidence}


@dataclass(frozen=True)
class ServerFacts:
    """What the deploy knows of the release and its server, to make a fix concrete."""

    image: str = ""
    tfserving_version: str = ""
    gpu_fraction: float | None = None  # the instance's --per_process_gpu_memory_fraction
    gpu_mib: int | None = None  # the memory of the GPU it runs on
    memory_mib: int | None = None  # the catalog's footprint of one release


Explain = Callable[[re.Match[str], ServerFacts], tuple[str, str]]
"""A match and the facts -> (cause, fix)."""


@dataclass(frozen=True)
class Pattern:
    """One failure as the real server words it."""

    kind: Kind
    regex: re.Pattern[str]
    source: str  # where the real server's message is built
    explain: Explain


# -- the explanations ------------------------------------------------------------------------

PYTHON_OPS = {"EagerPyFunc": "tf.py_function", "PyFunc": "tf.numpy_function (or tf.py_func)",
              "PyFuncStateless": "tf.numpy_function(stateful=False)"}
"""Ops whose kernels live only in TensorFlow's Python extension
(tensorflow/python/lib/core/py_func.cc): a C++ server registers the op (script_ops.cc is in
TensorFlow's core ops) but never a kernel for it."""


def _variables(match: re.Match[str], facts: ServerFacts) -> tuple[str, str]:
    variable = match["var"]
    return (f"variable {variable!r} is not restored when TFServing loads the SavedModel "
            "Session-style (restore op, then Session::Run): the export does not save it where "
            "that loader restores from, as when a Keras 3 model held in a tf.Module is saved "
            "with tf.saved_model.save (tensorflow/tensorflow#72963)",
            "re-export the model with Keras's model.export(path) (or keras.export.ExportArchive "
            "tracking the model), which saves every variable for TFServing's loader, and deploy "
            "that export as a new version")


def _op(match: re.Match[str], facts: ServerFacts) -> tuple[str, str]:
    op = match["op"]
    api = PYTHON_OPS.get(op)
    if api is not None:
        return (f"the graph runs Python: op {op!r} comes from {api}, whose kernel exists only "
                "inside a Python process; the C++ model server has none",
                f"rebuild the model without {api} (write that step with TensorFlow ops, or do "
                "it in the client before the request) and deploy the new export as a new "
                "version")
    server = f" ({facts.image})" if facts.image else ""
    return (f"the graph uses op {op!r}, which the serving binary{server} does not provide "
            "(a custom op, or one from a library the server was not built with)",
            f"rebuild the model without {op!r}, or serve it with a TFServing build that links "
            "the op's library (TFServing's g3doc/custom_op.md) and set the hosts' image and "
            "tfserving_version vars to that build")


def _too_new(match: re.Match[str], facts: ServerFacts) -> tuple[str, str]:
    what, tensorflow = match["what"] or "GraphDef", match["tf"]
    now = " / ".join(v for v in (facts.image, facts.tfserving_version) if v)
    return (f"the SavedModel was written by a newer TensorFlow than the server's: its {what} "
            f"needs consumer version {match['need']}, the server's TensorFlow {tensorflow} "
            f"reads up to {match['have']}",
            "serve it with a TFServing release at least as new as the TensorFlow that exported "
            "it: set the hosts' image and tfserving_version vars"
            + (f" (now {now})" if now else "")
            + f", or export the model with TensorFlow {tensorflow} or older")


def _refused_consumer(match: re.Match[str], facts: ServerFacts) -> tuple[str, str]:
    what = match["what"] or "GraphDef"
    return (f"the SavedModel's {what} refuses the server's TensorFlow (consumer version "
            f"{match['have']}) as one known to be buggy for it",
            "serve it with a newer TFServing release (the hosts' image and tfserving_version "
            "vars), or re-export the model with the server's TensorFlow release")


def _gpu_memory(match: re.Match[str], facts: ServerFacts) -> tuple[str, str]:
    reserved = ""
    if facts.gpu_fraction is not None and facts.gpu_mib:
        reserved = (f" (fraction {facts.gpu_fraction:g} of {facts.gpu_mib} MiB = "
                    f"{facts.gpu_fraction * facts.gpu_mib:.0f} MiB"
                    + (f", sized from memory_mib {facts.memory_mib}" if facts.memory_mib
                       else "") + ")")
    return ("the release ran out of GPU memory while loading: the model needs more than the "
            f"memory its server reserved{reserved}",
            "size the model's GPU memory to what it uses: raise the catalog's memory_mib (or "
            "the host var gpu_safety_margin) so that --per_process_gpu_memory_fraction covers "
            "it, run fewer instances or models on the GPU, or place the model on a larger GPU")


def _warmup_file(match: re.Match[str], facts: ServerFacts) -> tuple[str, str]:
    return ("the version's warmup file assets.extra/tf_serving_warmup_requests is not a "
            "TFRecord file of PredictionLog records; warmup runs inside the load, so the load "
            "fails",
            "rewrite the warmup file as a TFRecord file (tf.io.TFRecordWriter) of at most 1000 "
            "serialized tensorflow.serving.PredictionLog records the model answers, or remove "
            "it (the version then loads without warmup), and publish it as a new version")


def _pattern(kind: Kind, regex: str, source: str, explain: Explain) -> Pattern:
    return Pattern(kind, re.compile(regex), source, explain)


PATTERNS: tuple[Pattern, ...] = (
    _pattern(Kind.MODEL_NEWER_THAN_SERVER,
             r"(?:(?P<what>GraphDef|Checkpoint) )?min consumer version (?P<need>\d+) above "
             r"current version (?P<have>\d+) for TensorFlow (?P<tf>\d[\w.+-]*?)\.(?:\s|$)",
             "tensorflow/core/framework/versions.cc CheckVersions", _too_new),
    _pattern(Kind.MODEL_NEWER_THAN_SERVER,
             r"(?P<what>GraphDef|Checkpoint) disallows consumer version (?P<have>\d+)",
             "tensorflow/core/framework/versions.cc CheckVersions", _refused_consumer),
    _pattern(Kind.OP_NOT_IN_SERVER,
             r"Op type not registered '(?P<op>[^']+)' in binary running on",
             "tensorflow/core/framework/op.cc OpNotFound", _op),
    _pattern(Kind.OP_NOT_IN_SERVER,
             r"No OpKernel was registered to support Op '(?P<op>[^']+)'",
             "tensorflow/core/common_runtime/colocation_graph.cc (the placer)", _op),
    _pattern(Kind.OP_NOT_IN_SERVER,
             r"No registered '(?P<op>[^']+)' OpKernel for",
             "tensorflow/core/framework/op_kernel.cc FindKernelRegistration", _op),
    _pattern(Kind.VARIABLES_NOT_RESTORED,
             r"Could not find variable (?P<var>\S+?)\. This could mean that the variable has "
             r"been deleted",
             "tensorflow/core/kernels/resource_variable_ops.cc ReadVariableOp::Compute",
             _variables),
    _pattern(Kind.VARIABLES_NOT_RESTORED,
             r"Resource [^/\s]+/(?P<var>\S+)/N10tensorflow3VarE does not exist",
             "tensorflow/core/framework/resource_mgr.cc (resource lookup)", _variables),
    _pattern(Kind.WARMUP_FILE_UNREADABLE,
             r"Please verify your warmup data is in TFRecord format|Failed to parse warmup "
             r"record",
             "tensorflow_serving/servables/tensorflow/saved_model_warmup_util.cc "
             "RunSavedModelWarmupUntracked", _warmup_file),
    _pattern(Kind.GPU_MEMORY_EXHAUSTED,
             r"OOM when allocating tensor[^\n]*(?:device:GPU|GPU_\d+_bfc)",
             "tensorflow/core/framework/op_kernel.cc OpKernelContext::allocate_tensor",
             _gpu_memory),
    _pattern(Kind.GPU_MEMORY_EXHAUSTED,
             r"Allocator \(GPU_\d+_bfc\) ran out of memory trying to allocate",
             "tensorflow/core/common_runtime/bfc_allocator.cc", _gpu_memory),
    _pattern(Kind.GPU_MEMORY_EXHAUSTED,
             r"CUDA_ERROR_OUT_OF_MEMORY",
             "xla/stream_executor/cuda/cuda_driver.cc (device memory allocation)", _gpu_memory),
)


def evidence_at(text: str, at: int, width: int = EVIDENCE_CHARS) -> str:
    """The line of ``text`` holding position ``at``, at most ``width`` characters of it,
    around ``at`` when the line is longer."""
    begin = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    line = text[begin:end if end >= 0 else len(text)]
    offset = at - begin
    if len(line) <= width:
        return line.strip()
    start = 0 if offset < width // 2 else offset - width // 4
    piece = line[start:start + width]
    return ("…" if start else "") + piece.strip() + ("…" if start + width < len(line) else "")


def diagnose(text: str, facts: ServerFacts | None = None) -> Diagnosis | None:
    """The first failure of ``PATTERNS`` that ``text`` (what a gate saw, then the server's log)
    shows, or None when it shows none of them."""
    for pattern in PATTERNS:
        match = pattern.regex.search(text)
        if match is not None:
            cause, fix = pattern.explain(match, facts or ServerFacts())
            return Diagnosis(pattern.kind, cause, fix, evidence_at(text, match.start()))
    return None


# -- the signature gate ----------------------------------------------------------------------

def _tensors(view: TensorView) -> str:
    return ", ".join(f"{name} {dtype} {list(shape)}" for name, (dtype, shape)
                     in sorted(view.items())) or "nothing"


def _names(signature: SignatureView) -> str:
    return (f"{', '.join(sorted(signature.get('inputs', {}))) or '-'} -> "
            f"{', '.join(sorted(signature.get('outputs', {}))) or '-'}")


def _listing(served: Mapping[str, SignatureView]) -> str:
    shown = [f"{name} ({_names(sig)})" for name, sig in sorted(served.items())
             if not name.startswith("__")]
    return "; ".join(shown) or "none"


def _same_names(a: SignatureView, b: SignatureView) -> bool:
    return all(set(a.get(side, {})) == set(b.get(side, {})) for side in ("inputs", "outputs"))


def diagnose_signature(name: str, contract: SignatureView, served: Mapping[str, SignatureView],
                       differences: Sequence[str]) -> Diagnosis:
    """Why the catalog's signature ``name`` (its ``contract``) is not what the model serves
    (``served``: every signature of its GetModelMetadata; ``differences``: what the gate
    found), and the fix, naming the signatures the model has."""
    listing = _listing(served)
    evidence = "; ".join(differences) or f"signature {name!r} differs"
    if name not in served:
        return Diagnosis(
            Kind.SIGNATURE_MISMATCH,
            f"the model has no signature {name!r}, the one the catalog's Model.signature "
            "names (and clients call)",
            f"the model's signatures are {listing}: set Signature(name=...) in the catalog to "
            f"the one clients call, or re-export the model with a signature named {name!r}",
            f"GetModelMetadata lists {listing}")
    have = served[name]
    twins = [other for other, sig in sorted(served.items())
             if other != name and not other.startswith("__") and _same_names(sig, contract)]
    hint = f"; {', '.join(twins)} has the contract's tensor names" if twins else ""
    return Diagnosis(
        Kind.SIGNATURE_MISMATCH,
        f"signature {name!r} takes {_tensors(have.get('inputs', {}))} and returns "
        f"{_tensors(have.get('outputs', {}))}; the catalog's contract is "
        f"{_tensors(contract.get('inputs', {}))} -> {_tensors(contract.get('outputs', {}))}",
        f"re-export the model so that {name!r} has the contract's inputs and outputs (or, if the "
        f"model is right, change the catalog's Signature); the model's signatures: "
        f"{listing}{hint}",
        evidence)


__all__ = ["PATTERNS", "Diagnosis", "Kind", "ServerFacts", "diagnose", "diagnose_signature"]
