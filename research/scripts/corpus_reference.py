#!/usr/bin/env python3
"""An independent re-implementation of candle_bleu_research::data::corpus, standard library only.

    python3 research/scripts/corpus_reference.py CATALOGS LANG
    python3 research/scripts/corpus_reference.py /usr/share/locale de

Reads CATALOGS/LANG/LC_MESSAGES/*.mo (system-dependent strings expanded as libintl does on
x86_64 Linux), applies the default rules of docs/translate.md ("Building the corpus": iso_*
skipped, plurals and multi-line messages skipped, contexts kept, whitespace normalised, empty,
untranslated and control-character pairs dropped, 3-30 source words, UTF-8 byte ratio <= 3,
most frequent translation per source with ties to the smallest, SHA-256 split key), and prints
the pair count, the split sizes and the SHA-256 of the sorted pairs, which must equal what
`cargo run --release --example corpus -- --catalogs CATALOGS --lang LANG` prints. It checks the
Rust builder; the crate does not use it.
"""
import hashlib, os, struct, sys, unicodedata

def sysdep_value(name):
    if name == "I": return "I"
    if not name.startswith("PRI") or len(name) < 5 or name[3] not in "diouxX": return None
    w = name[4:]
    if w in ("8","16","32","LEAST8","LEAST16","LEAST32","FAST8"): return name[3]
    if w in ("64","LEAST64","FAST16","FAST32","FAST64","MAX","PTR"): return "l" + name[3]
    return None

def read_mo(data):
    e = "<" if struct.unpack("<I", data[:4])[0] == 0x950412de else ">"
    rev, n, o, t = struct.unpack(e + "4I", data[4:20])
    def string(tab, i):
        l, off = struct.unpack(e + "2I", data[tab + 8*i: tab + 8*i + 8])
        return data[off:off+l]
    raw = [(string(o, i), string(t, i)) for i in range(n)]
    if rev & 0xffff >= 1:
        nseg, segtab, ns, otab, ttab = struct.unpack(e + "5I", data[28:48])
        vals = []
        for i in range(nseg):
            l, off = struct.unpack(e + "2I", data[segtab+8*i:segtab+8*i+8])
            vals.append(sysdep_value(data[off:off+l-1].decode()))
        def expand(tab, i):
            p = struct.unpack(e + "I", data[tab+4*i:tab+4*i+4])[0]
            so = struct.unpack(e + "I", data[p:p+4])[0]; p += 4; out = b""; ok = True
            while True:
                size, ref = struct.unpack(e + "2I", data[p:p+8]); p += 8
                out += data[so:so+size]; so += size
                if ref == 0xffffffff: break
                if vals[ref] is None: ok = False
                else: out += vals[ref].encode()
            return out[:-1] if ok else None
        for i in range(ns):
            a, b = expand(otab, i), expand(ttab, i)
            if a is not None and b is not None: raw.append((a, b))
    header = next((s for i, s in raw if i == b""), b"").decode("utf-8", "replace")
    cs = "utf-8"
    for line in header.split("\n"):
        if line.lower().startswith("content-type:") and "charset=" in line.lower():
            cs = line[line.lower().index("charset=") + 8:].split()[0].split(";")[0]
    if cs.lower() in ("ascii", "us-ascii"): cs = "utf-8"
    if cs.lower() == "euc-kr": cs = "cp949"   # WHATWG's EUC-KR is Windows-949
    if cs.lower() == "iso-8859-1": cs = "cp1252"  # WHATWG maps ISO-8859-1 to windows-1252
    msgs = []
    for i, s in raw:
        if i == b"": continue
        try:
            try: mid = i.decode("utf-8")
            except UnicodeDecodeError: mid = i.decode(cs)
            mstr = s.decode(cs)
        except UnicodeDecodeError:
            continue
        ctx = None
        if "\x04" in mid: ctx, mid = mid.split("\x04", 1)
        plural = "\0" in mid
        msgs.append((ctx, mid.split("\0")[0], plural, mstr.split("\0")))
    return msgs

WS = lambda c: c.isspace() and c not in "\x1c\x1d\x1e\x1f"  # Rust's char::is_whitespace
def norm(s):
    words, cur = [], ""
    for c in s:
        if WS(c):
            if cur: words.append(cur); cur = ""
        else: cur += c
    if cur: words.append(cur)
    return " ".join(words)
def strip(s):
    i, j = 0, len(s)
    while i < j and WS(s[i]): i += 1
    while j > i and WS(s[j-1]): j -= 1
    return s[i:j]

def key(s): return "".join(c.lower() for c in s if c.isalnum())

def main(catalogs, lang):
    d = os.path.join(catalogs, lang, "LC_MESSAGES")
    cand = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".mo") or f.startswith("iso_"): continue
        try:
            msgs = read_mo(open(os.path.join(d, f), "rb").read())
        except Exception as e:
            print(f"skipped {f}: {e!r}", file=sys.stderr)
            continue
        for ctx, mid, plural, mstr in msgs:
            if plural: continue
            tgt = mstr[0]
            if "\n" in strip(mid) or "\n" in strip(tgt): continue
            s, t = norm(mid), norm(tgt)
            if not s or not t or s == t: continue
            if any(unicodedata.category(c) == "Cc" for c in s + t): continue
            if not 3 <= len(s.split(" ")) <= 30: continue
            a, b = len(s.encode()), len(t.encode())
            if a / b > 3 or b / a > 3: continue
            cand.setdefault(s, {}).setdefault(t, 0)
            cand[s][t] += 1
    pairs = sorted((s, min(ts, key=lambda t: (-ts[t], t.encode()))) for s, ts in cand.items())
    pairs.sort(key=lambda p: (p[0].encode(), p[1].encode()))
    h = hashlib.sha256("".join(f"{s}\t{t}\n" for s, t in pairs).encode()).hexdigest()
    splits = {"train": 0, "dev": 0, "test": 0}
    for s, _ in pairs:
        b = int.from_bytes(hashlib.sha256(key(s).encode()).digest()[:8], "big") % 1000
        splits["test" if b < 50 else "dev" if b < 100 else "train"] += 1
    print(lang, len(pairs), splits, h)

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
