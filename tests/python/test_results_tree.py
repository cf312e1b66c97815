"""bench/results/ holds only raw files that a summary or a doc cites
(CONTRIBUTING.md, "Results"): no patches or C programs, at most 120 files,
and every file named by one of the citing texts below.

A citing text names a file by its path from the repository root, or from
the citing file's own folder (`../xeon2-amx/x.txt`, `results/...` from
bench/README.md); `{a,b}` braces and `*` globs within a file name count. A folder named with
a trailing `/` cites its README.md. A README.md under bench/results cites
too, but must itself be cited.
"""
import fnmatch
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RESULTS = "bench/results"
MAX_FILES = 120
BANNED = (".patch", ".diff", ".c", ".h", ".cc", ".cpp")
TOKEN = re.compile(r"[A-Za-z0-9_.{},*/-]+")


def expand(tok):
    m = re.search(r"\{([^{}]*)\}", tok)
    if not m:
        return [tok]
    out = []
    for alt in m.group(1).split(","):
        out += expand(tok[:m.start()] + alt + tok[m.end():])
    return out


def results_files():
    out = []
    for d, _, names in os.walk(os.path.join(ROOT, RESULTS)):
        for n in names:
            out.append(os.path.relpath(os.path.join(d, n), ROOT).replace(os.sep, "/"))
    return sorted(out)


def citing_texts(files):
    texts = ["README.md", "bench/README.md", "python/README.md"]
    texts += ["docs/" + n for n in sorted(os.listdir(os.path.join(ROOT, "docs"))) if n.endswith(".md")]
    texts += [f for f in files if f.endswith("/README.md")]
    return [t for t in texts if os.path.isfile(os.path.join(ROOT, t))]


def cited_paths(text):
    """(paths, globs) that the file `text` names, as root-relative paths."""
    base = os.path.dirname(text)
    with open(os.path.join(ROOT, text), encoding="utf-8") as f:
        body = f.read()
    paths, globs = set(), set()
    for raw in TOKEN.findall(body):
        for tok in expand(raw.strip(".,")):
            if not tok or tok in (".", ".."):
                continue
            is_dir = tok.endswith("/")
            for start in {base, ""}:
                p = os.path.normpath(os.path.join(start, tok)).replace(os.sep, "/")
                if is_dir:
                    p += "/README.md"
                if "*" not in p:
                    paths.add(p)
                elif len(os.path.basename(p).replace("*", "")) >= 3:   # not markdown's **
                    globs.add(p)
    return paths, globs


def test_no_programs_or_patches():
    bad = [f for f in results_files() if f.endswith(BANNED)]
    assert not bad, ("bench/results holds programs or patches (git history keeps "
                     "them; a script behind a cited figure belongs in bench/): %s" % bad)


def test_file_count():
    n = len(results_files())
    assert n <= MAX_FILES, "bench/results holds %d files, more than %d" % (n, MAX_FILES)


def test_every_results_file_is_cited():
    files = results_files()
    cited = {}
    for t in citing_texts(files):
        paths, globs = cited_paths(t)
        for f in files:
            if f == t:
                continue
            if f in paths or any(os.path.dirname(f) == os.path.dirname(g) and
                                 fnmatch.fnmatchcase(os.path.basename(f), os.path.basename(g))
                                 for g in globs):
                cited.setdefault(f, t)
    uncited = [f for f in files if f not in cited]
    assert not uncited, ("files under bench/results cited by no README or doc "
                         "(cite them or delete them): %s" % uncited)
