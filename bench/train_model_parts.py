"""bench/train_model.py's parts: the configs of real families (published
values), the data, the machine (CPU, bf16 unit, OpenMP runtimes) and the
step's breakdown by category from a torch.profiler trace, the loss plot.
See train_model.py."""
import os
import platform
import random

BACKENDS = ("sdpa", "tilegrad", "tilegrad-all", "tilegrad-dense", "sdpa-compile", "eager")
DEFAULT_BACKENDS = ("sdpa", "tilegrad", "tilegrad-all", "sdpa-compile")
# backend -> the breakdown categories it replaces (the rest it must leave as
# sdpa has them); tilegrad-all: from what use_tilegrad_kernels reports replaced
REPLACES = {"tilegrad": {"attention"}, "tilegrad-dense": {"attention"},
            "tilegrad-all": {"attention", "loss", "lm_head", "norm_elementwise", "embedding"}}
KERNEL_CATEGORIES = {"rope": ("norm_elementwise",), "swiglu": ("norm_elementwise",),
                     "geglu": ("norm_elementwise",), "rms_norm": ("norm_elementwise",),
                     "fused_linear_cross_entropy": ("loss", "lm_head"),
                     "embedding": ("embedding",)}


def replaced_categories(backend, replaced):
    """The categories `backend` replaces; `replaced`: use_tilegrad_kernels'
    {kernel: places} (unknown form: all it might)."""
    if backend != "tilegrad-all" or not isinstance(replaced, dict):
        return REPLACES.get(backend, set())
    cats = {"attention"}
    for kernel, n in replaced.items():
        if n:
            cats.update(KERNEL_CATEGORIES.get(kernel, REPLACES["tilegrad-all"]))
    return cats


CHECKED = ("gemm", "lm_head", "copies", "other")
CATEGORIES = ("attention", "gemm", "lm_head", "loss", "norm_elementwise", "embedding",
              "copies", "optimizer", "other", "untraced")

# Published config.json values (architecture fields; generation-only fields
# left out). "layers": the reduction for 2 cores / 24 GiB (None: in full).
CONFIGS = {
    "llama-style": {
        "family": "llama", "seq": (2048, 4096), "layers": None,
        "source": "a Llama-style config of real widths (LlamaConfig defaults otherwise; untied)",
        "config": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                       num_hidden_layers=6, num_attention_heads=12, num_key_value_heads=4,
                       head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-6,
                       rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu")},
    "llama-3.2-1b": {
        "family": "llama", "seq": (2048,), "layers": 4,
        "source": "meta-llama/Llama-3.2-1B config.json",
        "config": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                       num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=64, hidden_act="silu", max_position_embeddings=131072,
                       rms_norm_eps=1e-5, rope_theta=500000.0,
                       rope_scaling={"factor": 32.0, "high_freq_factor": 4.0,
                                     "low_freq_factor": 1.0,
                                     "original_max_position_embeddings": 8192,
                                     "rope_type": "llama3"},
                       attention_bias=False, mlp_bias=False, tie_word_embeddings=True,
                       bos_token_id=128000, eos_token_id=128001, initializer_range=0.02)},
    "qwen2.5-0.5b": {
        "family": "qwen2", "seq": (2048,), "layers": None,
        "source": "Qwen/Qwen2.5-0.5B config.json (q/k/v biases: Qwen2's attention has them)",
        "config": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                       hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, use_sliding_window=False, sliding_window=32768,
                       max_window_layers=24, tie_word_embeddings=True,
                       bos_token_id=151643, eos_token_id=151643, initializer_range=0.02)},
    "gemma-2-2b": {
        "family": "gemma2", "seq": (1024,), "layers": 2,
        "source": "google/gemma-2-2b config.json (sliding window on alternate layers: "
                  "layer 0 sliding, layer 1 global; the 4096 window acts only beyond seq 4096)",
        "note": "sdpa and sdpa-compile run without attn_logit_softcapping (transformers' "
                "sdpa_attention_forward drops the softcap: sdpa has no such argument); "
                "tilegrad and eager apply it",
        "config": dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                       num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                       head_dim=256, hidden_activation="gelu_pytorch_tanh",
                       hidden_act="gelu_pytorch_tanh", max_position_embeddings=8192,
                       rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=4096,
                       attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                       query_pre_attn_scalar=256, attention_bias=False,
                       tie_word_embeddings=True, pad_token_id=0, bos_token_id=2,
                       eos_token_id=1, initializer_range=0.02)},
    "bert-base": {
        "family": "bert", "seq": (128, 512), "layers": None, "batch": {128: 32, 512: 8},
        "lr": 5e-5,                                   # a fine-tune's learning rate
        "source": "google-bert/bert-base-uncased config.json; BertForSequenceClassification, "
                  "2 labels (a fine-tune)",
        "config": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                       num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                       hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                       max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                       pad_token_id=0, initializer_range=0.02, num_labels=2)},
    "toy": {  # --quick: the byte-level model of the CI smoke test
        "family": "llama", "seq": (512,), "layers": None, "bytes": True,
        "source": "byte-level toy Llama (vocab 256, no family)",
        "config": dict(vocab_size=256, hidden_size=256, intermediate_size=1024,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=64, max_position_embeddings=8192, tie_word_embeddings=False,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)},
}
REAL = tuple(n for n in CONFIGS if n != "toy")


def config_kwargs(name, layers):
    """The kwargs of this config's transformers config: published values, the
    layer count (reduced or --layers), training changes. A fresh dict (and the
    worker builds a fresh config object from it) per model."""
    spec = CONFIGS[name]
    kw = dict(spec["config"], use_cache=False)
    if layers:
        kw["num_hidden_layers"] = layers
    if spec["family"] == "bert":
        kw.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    else:
        kw["attention_dropout"] = 0.0
    return kw


def build_model(name, layers, attn, seed):
    """Config `name`'s model with random weights (seed), float32, in training
    mode, from a config object of its own (from_config writes
    attn_implementation into it) with `layers` layers (layers_run's count),
    on transformers' `attn` attention; raises where transformers runs
    another. BERT: sequence classification, else a causal LM."""
    import torch
    import transformers
    family = CONFIGS[name]["family"]
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "gemma2": transformers.Gemma2Config, "bert": transformers.BertConfig}[family]
    config = cls(**config_kwargs(name, layers))
    auto = (transformers.AutoModelForSequenceClassification if family == "bert"
            else transformers.AutoModelForCausalLM)
    torch.manual_seed(seed)
    model = auto.from_config(config, attn_implementation=attn, dtype=torch.float32)
    if model.config._attn_implementation != attn:
        raise RuntimeError(f"transformers runs {model.config._attn_implementation!r}, not {attn!r}")
    return model.train()


def layers_run(name, override):
    """(layers trained, why): --layers, the config's reduction, or in full."""
    spec = CONFIGS[name]
    if override:
        return override, "--layers"
    if spec["layers"]:
        return spec["layers"], "reduced for 2 cores / 24 GiB"
    return spec["config"]["num_hidden_layers"], "in full"


def describe(name, override=None):
    """One line: the config, its reduction and its source."""
    spec = CONFIGS[name]
    c = spec["config"]
    heads = f"{c['num_attention_heads']}" + (f"/{c['num_key_value_heads']}"
                                             if "num_key_value_heads" in c else "")
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    run, why = layers_run(name, override)
    full = c["num_hidden_layers"]
    red = f"{full} layers ({why})" if run == full else f"{run} of {full} layers ({why})"
    extra = [f"{k} {c[k]}" for k in ("rope_theta", "sliding_window", "attn_logit_softcapping",
                                     "final_logit_softcapping", "query_pre_attn_scalar")
             if c.get(k) is not None and c.get("use_sliding_window", True)]
    if "rope_scaling" in c:
        extra.append(f"rope_scaling {c['rope_scaling']['rope_type']}")
    tied = c.get("tie_word_embeddings", spec["family"] == "bert")
    return (f"{name}: hidden {c['hidden_size']}, {red}, {heads} heads of {hd}, "
            f"MLP {c['intermediate_size']}, vocab {c['vocab_size']}, "
            f"{'tied' if tied else 'untied'} embeddings"
            + "".join(", " + x for x in extra) + f"; dropout off; {spec['source']}"
            + (f". NB: {spec['note']}" if "note" in spec else ""))


# ----------------------------------------------------------------- the data

WORDS = {
    "name": "Ada Bram Cleo Dara Emil Fenn Gala Hugo Iris Jude Kira Lars Mona Nils Oona Per".split(),
    "noun": ("kernel tile thread cache buffer matrix vector head query key value gradient "
             "batch token layer model loop stride block lane register queue").split(),
    "adj": "small large fast slow warm cold even odd dense sparse exact wide narrow".split(),
    "verb": "reads writes sums scales copies splits moves sorts checks loads stores packs".split(),
    "place": "the first row|the last column|each tile|the shared cache|every lane|the next block".split("|"),
}


def sentence(rng):
    """One line: a templated sentence, a sum, or a count; all learnable."""
    kind = rng.random()
    if kind < 0.55:
        return (f"{rng.choice(WORDS['name'])} {rng.choice(WORDS['verb'])} the "
                f"{rng.choice(WORDS['adj'])} {rng.choice(WORDS['noun'])} in "
                f"{rng.choice(WORDS['place'])}.")
    if kind < 0.8:
        a, b = rng.randrange(1000), rng.randrange(1000)
        return f"{a} + {b} = {a + b}"
    noun = rng.choice(WORDS["noun"])
    n = rng.randrange(2, 9)
    return f"The {noun}s: " + ", ".join(f"{noun} {i}" for i in range(1, n + 1)) + "."


def generated_text(nbytes, seed):
    """nbytes of deterministic text (paragraphs of sentences)."""
    rng, parts, size = random.Random(seed), [], 0
    while size < nbytes:
        para = " ".join(sentence(rng) for _ in range(rng.randrange(3, 8))) + "\n\n"
        parts.append(para)
        size += len(para)
    return "".join(parts).encode("ascii")[:nbytes]


def make_batches(torch, name, n, batch, seq, seed):
    """(input_ids [n, batch, seq], labels, the bytes hashed): causal LMs'
    labels are the inputs (transformers shifts them); BERT's one per window."""
    vocab = CONFIGS[name]["config"]["vocab_size"]
    stream = generated_text(n * batch * seq, seed)
    raw = torch.frombuffer(bytearray(stream), dtype=torch.uint8).long().view(n, batch, seq)
    if CONFIGS[name].get("bytes"):
        ids = raw
    else:
        table = torch.tensor(random.Random(seed).sample(range(1000, vocab), 256))
        ids = table[raw]
    if CONFIGS[name]["family"] != "bert":
        return ids, ids, stream
    digits = ((raw >= ord("0")) & (raw <= ord("9"))).sum(-1)
    return ids, (digits > digits.flatten().median()).long(), stream


def packed_rows(torch, n, batch, seq, lengths, seed):
    """Packed rows, as DataCollatorWithFlattening makes them: documents of
    lengths drawn uniformly from `lengths` (lo, hi) filling each row (the
    last one cut), position_ids restarting at 0 in every document, and the
    first label of every document -100. Returns (position_ids [n, batch,
    seq], document index [n, batch, seq], first-of-document flags)."""
    rng = random.Random(seed + 1)
    pos = torch.empty(n, batch, seq, dtype=torch.long)
    doc = torch.empty(n, batch, seq, dtype=torch.long)
    for i in range(n):
        for b in range(batch):
            t, d = 0, 0
            while t < seq:
                m = min(rng.randint(*lengths), seq - t)
                pos[i, b, t:t + m] = torch.arange(m)
                doc[i, b, t:t + m] = d
                t, d = t + m, d + 1
    return pos, doc, pos == 0


def dense_packed_mask(torch, doc, dtype):
    """transformers' packed mask as a dense additive [batch, 1, seq, seq]
    (causal within each document): what tilegrad-dense is handed."""
    seq = doc.shape[-1]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    allowed = (doc[:, :, None] == doc[:, None, :]) & causal
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))[:, None]


# ----------------------------------------------------- the machine and dtype

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model Name")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_has_bf16_unit():
    """x86: avx512_bf16 or amx_bf16; aarch64: bf16 (FEAT_BF16). Linux only."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set()
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags.update(line.split(":", 1)[1].split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def openmp_report(torch, tilegrad_lib):
    """Which OpenMP runtime torch's library and tilegrad's resolved to: the
    omp_get_max_threads that dlsym finds through each library's handle (its
    own dependencies), the file dladdr names; plus every OpenMP runtime mapped."""
    import ctypes

    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
    libc = ctypes.CDLL(None)
    libc.dlsym.restype, libc.dlsym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]

    def resolve(path):
        try:
            handle = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)._handle
        except OSError as e:
            return f"not loaded ({e})"
        addr = libc.dlsym(handle, b"omp_get_max_threads")
        info = DlInfo()
        if not addr or not libc.dladdr(addr, ctypes.byref(info)):
            return "no OpenMP symbol"
        return os.path.realpath(info.fname.decode())

    out = {"torch": resolve(os.path.join(os.path.dirname(torch.__file__), "lib",
                                         "libtorch_cpu.so"))}
    if tilegrad_lib:
        out["tilegrad"] = resolve(tilegrad_lib)
        out["one_pool"] = out["tilegrad"] == out["torch"]
    with open("/proc/self/maps") as f:
        out["mapped"] = sorted({line.split()[-1] for line in f if any(
            s in line.rsplit("/", 1)[-1] for s in ("libgomp", "libomp", "libiomp"))})
    return out


# ------------------------------------------------------- the step breakdown

BLOCKS = (  # (category, name fragments): an op and everything under it (priority order)
    ("attention", ("attention_function", "scaleddotproduct", "flashattention",
                   "efficientattention", "tilegrad::attn", "attnfunction")),
    ("optimizer", ("optimizer.", "clip_grad_norm")),
    ("loss", ("crossentropy", "nllloss", "logsoftmax", "lce", "linearce", "causallmloss",
              "tilegrad::ce")),
    ("embedding", ("embedding",)),
)
GEMMS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot",
         "addmmactivation", "mkldnnlinear"}
COPIES = {"to", "_to_copy", "copy_", "contiguous", "clone", "_autocast_to_reduced_precision",
          "_autocast_to_full_precision", "tocopy"}
ELEMENTWISE = ("norm", "rms", "silu", "gelu", "mul", "add", "sub", "div", "neg", "pow", "sqrt",
               "mean", "tanh", "sigmoid", "exp", "cos", "sin", "cat", "dropout", "softmax",
               "where", "masked_fill", "rope", "rotary", "glu", "sum", "tilegrad::")


def _base(name):
    """'aten::addmm' -> 'addmm'; 'AddmmBackward0' -> 'addmm'; lower case."""
    n = name.split("::", 1)[1] if name.startswith("aten::") else name
    for tail in ("Backward0", "Backward1", "Backward"):
        if n.endswith(tail):
            n = n[:-len(tail)]
    return n.lower()


def _blocks(ev, memo):
    """The BLOCKS categories of ev and its ancestors (memoized by event)."""
    key = id(ev)
    if key not in memo:
        name = ev.name.lower().replace("_", "")
        own = {cat for cat, frags in BLOCKS if any(f.replace("_", "") in name for f in frags)}
        memo[key] = own | (_blocks(ev.cpu_parent, memo) if ev.cpu_parent is not None else set())
    return memo[key]


def categorize(ev, vocab, memo):
    """ev's category (vocab None: no vocabulary-shaped rules, where V is one
    of the model's other dims, as the toy's 256 = hidden)."""
    found = _blocks(ev, memo)
    block = next((cat for cat, _ in BLOCKS if cat in found), None)
    base, shapes = _base(ev.name), [s for s in (ev.input_shapes or []) if s]
    if base.replace("_", "") in GEMMS and block in (None, "loss"):
        # the LM head's GEMMs, inside a fused linear cross-entropy too
        if vocab and any(vocab in s for s in shapes):
            return "lm_head"
        return block or "gemm"
    if block:
        return block
    if vocab and any(len(s) >= 2 and s[-1] == vocab for s in shapes):
        return "loss"            # logits-shaped: their casts, softcap, the gradient's fill_
    if vocab and any(len(s) == 2 and s[0] == vocab for s in shapes):
        return "lm_head"         # [V, H]: the head weight's casts and gradient adds
    if base in COPIES or "autocast" in base:
        return "copies"
    if "accumulategrad" in base:
        return "other"
    if any(f in base for f in ELEMENTWISE):
        return "norm_elementwise"
    return "other"


def breakdown(prof, wall_s, vocab):
    """{category: ms} (self times) and each category's top ops, by name and
    input shapes (where to look: which copy, of what)."""
    ms = dict.fromkeys(CATEGORIES, 0.0)
    ops, memo = {}, {}
    for ev in prof.events():
        t = ev.self_cpu_time_total / 1e3
        if t <= 0:
            continue
        cat = categorize(ev, vocab, memo)
        ms[cat] += t
        key = (cat, f"{ev.name} {[s for s in (ev.input_shapes or []) if s][:3]}")
        ops[key] = ops.get(key, 0.0) + t
    ms["untraced"] = max(0.0, 1e3 * wall_s - sum(ms.values()))
    top = {c: sorted(((n, round(t, 2)) for (c2, n), t in ops.items() if c2 == c),
                     key=lambda x: -x[1])[:8] for c in CATEGORIES}
    return ms, top


# ------------------------------------------------------------ the loss plot

def plot(path, runs, smooth):
    """The loss curves: a panel per config (and seq), a line per backend
    (x threads), line styles that keep curves on each other visible."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not importable: no PNG ({path})")
        return None
    panels = {}
    for run in runs:
        panels.setdefault((run["config"], run["seq"]), []).append(run)
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, ((name, seq), group) in zip(axes[0], panels.items()):
        i = 0
        for run in group:
            for b, r in run["backends"].items():
                if "losses" in r:
                    label = b + (f" {run['threads']}t" if len(group) > 1 else "")
                    ax.plot(r["losses"], color=f"C{i}", linestyle=("-", "--", ":", "-.")[i % 4],
                            linewidth=max(0.8, 2.5 - 0.5 * i), label=label)
                    i += 1
        ax.set_title(f"{name}, seq {seq} (the check: {smooth}-step moving averages)", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"loss curves: {path}")
    return path
