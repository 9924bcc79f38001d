// A small syntax highlighter for code blocks: one scanner, configured per language by its
// comments, strings and keywords. It returns text nodes and <span class="tok-…"> elements
// (keyword, string, comment, number, literal, type, function), never HTML.

const words = (s) => new Set(s.split(" "));

const C_LIKE = {
  line: ["//"],
  block: [["/*", "*/"]],
  strings: ['"', "'"],
};

const LANGUAGES = {
  python: {
    line: ["#"],
    strings: ['"""', "'''", '"', "'"],
    prefixes: /[rbfuRBFU]{1,2}$/,
    keywords: words(
      "and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield match case",
    ),
    literals: words("True False None self cls"),
    builtins: words(
      "print len range int str float list dict set tuple bool open enumerate zip map filter sorted sum min max abs isinstance super type iter next any all repr",
    ),
  },
  javascript: {
    ...C_LIKE,
    strings: ['"', "'", "`"],
    keywords: words(
      "async await break case catch class const continue debugger default delete do else export extends finally for function if import in instanceof let new of return static super switch this throw try typeof var void while with yield from as interface type enum implements private public protected readonly",
    ),
    literals: words("true false null undefined NaN Infinity"),
    builtins: words("console document window Math JSON Object Array String Number Promise Map Set Error"),
  },
  rust: {
    ...C_LIKE,
    strings: ['"'],
    keywords: words(
      "as async await break const continue crate dyn else enum extern fn for if impl in let loop match mod move mut pub ref return self Self static struct super trait type unsafe use where while",
    ),
    literals: words("true false None Some Ok Err"),
    builtins: words("println print format vec assert assert_eq panic write writeln eprintln todo unimplemented"),
  },
  c: {
    ...C_LIKE,
    line: ["//", "#"],
    keywords: words(
      "auto break case catch class const constexpr continue default delete do else enum explicit extern for friend goto if inline namespace new noexcept operator private protected public register return sizeof static struct switch template this throw try typedef typename union using virtual volatile while",
    ),
    literals: words("true false NULL nullptr"),
    builtins: words("int char float double long short unsigned signed void bool size_t std printf malloc free"),
  },
  java: {
    ...C_LIKE,
    keywords: words(
      "abstract assert break case catch class const continue default do else enum extends final finally for if implements import instanceof interface native new package private protected public return static super switch synchronized this throw throws try var void volatile while record",
    ),
    literals: words("true false null"),
    builtins: words("int long short byte char float double boolean String System Object"),
  },
  go: {
    ...C_LIKE,
    strings: ['"', "'", "`"],
    keywords: words(
      "break case chan const continue default defer else fallthrough for func go goto if import interface map package range return select struct switch type var",
    ),
    literals: words("true false nil iota"),
    builtins: words("append cap close copy delete len make new panic print println recover string int error byte rune"),
  },
  bash: {
    line: ["#"],
    strings: ['"', "'"],
    keywords: words("if then else elif fi for in do done while until case esac function return local export set unset"),
    literals: words("true false"),
    builtins: words("echo cd ls cat grep sed awk printf read source exit test mkdir rm cp mv"),
  },
  json: {
    strings: ['"'],
    keywords: words(""),
    literals: words("true false null"),
  },
  sql: {
    line: ["--"],
    block: [["/*", "*/"]],
    strings: ["'", '"'],
    caseless: true,
    keywords: words(
      "select from where and or not insert into values update set delete create table drop alter index join left right inner outer on group by order having limit as distinct union all primary key foreign references null is in like between case when then else end",
    ),
    literals: words("true false"),
  },
  css: {
    block: [["/*", "*/"]],
    strings: ['"', "'"],
    keywords: words("@media @import @keyframes @font-face !important"),
    literals: words(""),
  },
  yaml: {
    line: ["#"],
    strings: ['"', "'"],
    keywords: words(""),
    literals: words("true false null yes no"),
  },
};

const ALIASES = {
  py: "python",
  python3: "python",
  js: "javascript",
  jsx: "javascript",
  ts: "javascript",
  tsx: "javascript",
  typescript: "javascript",
  mjs: "javascript",
  rs: "rust",
  h: "c",
  cpp: "c",
  "c++": "c",
  cc: "c",
  hpp: "c",
  cs: "java",
  csharp: "java",
  kotlin: "java",
  golang: "go",
  sh: "bash",
  shell: "bash",
  zsh: "bash",
  console: "bash",
  yml: "yaml",
  toml: "yaml",
  jsonc: "json",
  scss: "css",
  postgresql: "sql",
  sqlite: "sql",
  mysql: "sql",
};

/** The language a fence's info string names, or null when the highlighter does not know it. */
export function language(name) {
  const key = (name || "").toLowerCase();
  return LANGUAGES[key] ? key : ALIASES[key] || null;
}

const NUMBER = /^(0x[\da-fA-F_]+|0b[01_]+|\d[\d_]*(\.\d[\d_]*)?([eE][+-]?\d+)?)[a-zA-Z]*/;
const WORD = /^[A-Za-z_$][\w$]*/;
const AT_RULE = /^[@!][\w-]+/;

/** `source` as a fragment of text nodes and highlighted spans; unknown languages stay plain. */
export function highlight(source, name) {
  const fragment = document.createDocumentFragment();
  const lang = LANGUAGES[language(name)];
  if (!lang) {
    fragment.append(document.createTextNode(source));
    return fragment;
  }
  let plain = "";
  const push = (kind, text) => {
    if (!kind) {
      plain += text;
      return;
    }
    if (plain) fragment.append(document.createTextNode(plain));
    plain = "";
    const span = document.createElement("span");
    span.className = `tok-${kind}`;
    span.textContent = text;
    fragment.append(span);
  };
  let i = 0;
  scan: while (i < source.length) {
    const rest = source.slice(i);
    for (const marker of lang.line || []) {
      // `#` starts a C preprocessor line only at the line's start, and a comment elsewhere.
      if (rest.startsWith(marker) && (marker !== "#" || lang !== LANGUAGES.c || /(^|\n)\s*$/.test(source.slice(0, i)))) {
        const end = rest.indexOf("\n");
        const text = end < 0 ? rest : rest.slice(0, end);
        push(lang === LANGUAGES.c && marker === "#" ? "keyword" : "comment", text);
        i += text.length;
        continue scan;
      }
    }
    for (const [open, close] of lang.block || []) {
      if (rest.startsWith(open)) {
        const end = rest.indexOf(close, open.length);
        const text = end < 0 ? rest : rest.slice(0, end + close.length);
        push("comment", text);
        i += text.length;
        continue scan;
      }
    }
    for (const quote of lang.strings || []) {
      if (rest.startsWith(quote)) {
        let j = quote.length;
        while (j < rest.length && !rest.startsWith(quote, j)) {
          if (rest[j] === "\\") j++;
          else if (rest[j] === "\n" && quote.length === 1 && quote !== "`") break;
          j++;
        }
        const text = rest.slice(0, Math.min(j + quote.length, rest.length));
        push("string", text);
        i += text.length;
        continue scan;
      }
    }
    let m = NUMBER.exec(rest);
    if (m && !/[\w$]/.test(source[i - 1] || "")) {
      push("number", m[0]);
      i += m[0].length;
      continue;
    }
    m = lang === LANGUAGES.css && AT_RULE.exec(rest);
    if (m) {
      push(lang.keywords.has(m[0]) ? "keyword" : null, m[0]);
      i += m[0].length;
      continue;
    }
    m = WORD.exec(rest);
    if (m) {
      const word = m[0];
      // Python's string prefixes (f"…", rb'…') belong to the string that follows.
      if (lang.prefixes && lang.prefixes.test(word) && (lang.strings || []).some((q) => rest.startsWith(q, word.length))) {
        push("string", word);
        i += word.length;
        continue;
      }
      const key = lang.caseless ? word.toLowerCase() : word;
      const after = source.slice(i + word.length).match(/^\s*(\(|!\()/);
      const kind = lang.keywords.has(key)
        ? "keyword"
        : lang.literals.has(key)
          ? "literal"
          : lang.builtins && lang.builtins.has(key)
            ? "builtin"
            : after
              ? "function"
              : /^[A-Z][a-z]/.test(word)
                ? "type"
                : null;
      push(kind, word);
      i += word.length;
      continue;
    }
    push(null, rest[0]);
    i++;
  }
  if (plain) fragment.append(document.createTextNode(plain));
  return fragment;
}
