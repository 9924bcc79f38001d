// A TeX subset to MathML, which the browser lays out: letters, numbers, operators, Greek and the
// common symbols, ^ and _, \frac, \sqrt, \binom, accents, \text and font commands, \left…\right,
// big operators with limits, and matrix/cases environments. A command it does not know shows as
// red text (<merror>), so a formula never disappears. Elements are built with
// createElementNS and text goes in as text, never as markup.

const NS = "http://www.w3.org/1998/Math/MathML";

const GREEK = "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi pi varpi rho varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega";
const GREEK_CHARS = "αβγδϵεζηθϑικλμνξπϖρϱσςτυϕφχψωΓΔΘΛΞΠΣΥΦΨΩ";
const SYMBOLS = {};
GREEK.split(" ").forEach((name, k) => (SYMBOLS[name] = { mi: GREEK_CHARS[k] }));

const OPERATORS = {
  cdot: "⋅", times: "×", div: "÷", pm: "±", mp: "∓", ast: "∗", star: "⋆", circ: "∘", bullet: "∙",
  leq: "≤", le: "≤", geq: "≥", ge: "≥", neq: "≠", ne: "≠", approx: "≈", equiv: "≡", sim: "∼",
  simeq: "≃", cong: "≅", propto: "∝", ll: "≪", gg: "≫", in: "∈", notin: "∉", ni: "∋",
  subset: "⊂", supset: "⊃", subseteq: "⊆", supseteq: "⊇", cup: "∪", cap: "∩", setminus: "∖",
  wedge: "∧", land: "∧", vee: "∨", lor: "∨", neg: "¬", lnot: "¬", forall: "∀", exists: "∃",
  to: "→", rightarrow: "→", leftarrow: "←", gets: "←", Rightarrow: "⇒", Leftarrow: "⇐",
  leftrightarrow: "↔", Leftrightarrow: "⇔", implies: "⟹", iff: "⟺", mapsto: "↦",
  uparrow: "↑", downarrow: "↓", mid: "∣", parallel: "∥", perp: "⊥", angle: "∠",
  ldots: "…", dots: "…", cdots: "⋯", vdots: "⋮", ddots: "⋱", prime: "′", oplus: "⊕",
  otimes: "⊗", langle: "⟨", rangle: "⟩", lfloor: "⌊", rfloor: "⌋", lceil: "⌈", rceil: "⌉",
  vert: "|", lvert: "|", rvert: "|", Vert: "‖", lbrace: "{", rbrace: "}", colon: ":",
};
const LARGE = { sum: "∑", prod: "∏", coprod: "∐", int: "∫", iint: "∬", iiint: "∭", oint: "∮", bigcup: "⋃", bigcap: "⋂" };
const IDENTIFIERS = { infty: "∞", partial: "∂", nabla: "∇", emptyset: "∅", varnothing: "∅", hbar: "ℏ", ell: "ℓ", Re: "ℜ", Im: "ℑ", aleph: "ℵ" };
const FUNCTIONS = "sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln lg exp det dim ker deg gcd arg";
const LIMITS = "lim limsup liminf max min sup inf";
const ACCENTS = { hat: "^", widehat: "^", bar: "¯", overline: "¯", vec: "→", dot: "˙", ddot: "¨", tilde: "~", widetilde: "~" };
const FONTS = { mathbf: "bold", mathbb: "double-struck", mathcal: "script", mathfrak: "fraktur", mathit: "italic", mathrm: "normal", mathsf: "sans-serif", mathtt: "monospace", boldsymbol: "bold-italic", operatorname: "normal" };
const SPACES = { ",": "0.1667em", ":": "0.2222em", ";": "0.2778em", " ": "0.25em", quad: "1em", qquad: "2em", "!": "-0.1667em" };
const MATRICES = { matrix: ["", ""], pmatrix: ["(", ")"], bmatrix: ["[", "]"], Bmatrix: ["{", "}"], vmatrix: ["|", "|"], Vmatrix: ["‖", "‖"], cases: ["{", ""], aligned: ["", ""], align: ["", ""], "align*": ["", ""], array: ["", ""] };

function node(tag, children = [], attrs = {}) {
  const n = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
  for (const c of children) n.append(c);
  return n;
}
const leaf = (tag, text, attrs) => {
  const n = node(tag, [], attrs);
  n.textContent = text;
  return n;
};
const row = (items) => (items.length === 1 ? items[0] : node("mrow", items));

/** `source` (TeX, without its delimiters) as a <math> element, display-style when `display`. */
export function renderTex(source, display) {
  const parser = new Parser(source);
  let body;
  try {
    body = parser.list(null);
  } catch {
    const error = node("merror");
    error.append(leaf("mtext", source));
    body = [error];
  }
  const math = node("math", [node("semantics", [row(body), leaf("annotation", source, { encoding: "application/x-tex" })])]);
  if (display) math.setAttribute("display", "block");
  return math;
}

class Parser {
  constructor(source) {
    this.s = source;
    this.i = 0;
  }

  // Items up to `end` (a closing brace, `\right`, `\end`) or the end of the source.
  list(end) {
    const items = [];
    for (;;) {
      this.skipSpace();
      if (this.i >= this.s.length) return items;
      if (end && end.some((e) => this.s.startsWith(e, this.i))) return items;
      const c = this.s[this.i];
      if (c === "^" || c === "_") {
        this.i++;
        const base = items.pop() || node("mrow");
        items.push(this.scripts(base, c));
        continue;
      }
      if (c === "'") {
        this.i++;
        const base = items.pop() || node("mrow");
        items.push(node("msup", [base, leaf("mo", "′")]));
        continue;
      }
      items.push(this.atom());
    }
  }

  skipSpace() {
    while (this.i < this.s.length && /\s/.test(this.s[this.i])) this.i++;
  }

  // ^ and _ after `base` (either order, each at most once).
  scripts(base, first) {
    let sub = null;
    let sup = null;
    let c = first;
    for (;;) {
      if (c === "^") sup = this.argument();
      else sub = this.argument();
      this.skipSpace();
      c = this.s[this.i];
      if ((c === "^" && !sup) || (c === "_" && !sub)) this.i++;
      else break;
    }
    const over = base.getAttribute("data-limits") === "true";
    if (sub && sup) return node(over ? "munderover" : "msubsup", [base, sub, sup]);
    if (sub) return node(over ? "munder" : "msub", [base, sub]);
    return node(over ? "mover" : "msup", [base, sup]);
  }

  // One argument: a braced group, a command, or one character.
  argument() {
    this.skipSpace();
    if (this.i >= this.s.length) return node("mrow");
    if (this.s[this.i] === "{") return this.group();
    return this.atom();
  }

  group() {
    this.i++;
    const items = this.list(["}"]);
    this.i++;
    return row(items);
  }

  // Text in braces, read as written (for \text and \begin names).
  rawGroup() {
    this.skipSpace();
    if (this.s[this.i] !== "{") return "";
    let depth = 0;
    const start = this.i + 1;
    for (; this.i < this.s.length; this.i++) {
      if (this.s[this.i] === "{") depth++;
      else if (this.s[this.i] === "}" && --depth === 0) break;
    }
    return this.s.slice(start, this.i++);
  }

  atom() {
    const c = this.s[this.i];
    if (c === "{") return this.group();
    if (c === "\\") return this.command();
    this.i++;
    if (/[0-9.]/.test(c)) {
      let n = c;
      while (this.i < this.s.length && /[0-9.]/.test(this.s[this.i])) n += this.s[this.i++];
      return leaf("mn", n);
    }
    if (/[A-Za-z]/.test(c)) return leaf("mi", c);
    if (c === "}") return leaf("mo", "}");
    if (c === "&") return leaf("mo", "&");
    if (c === "~") return node("mspace", [], { width: "0.25em" });
    return leaf("mo", c === "-" ? "−" : c);
  }

  command() {
    this.i++;
    const m = /^([A-Za-z]+\*?|.)/.exec(this.s.slice(this.i)) || [""];
    const name = m[0];
    this.i += name.length;
    if (SYMBOLS[name]) return leaf("mi", SYMBOLS[name].mi);
    if (OPERATORS[name]) return leaf("mo", OPERATORS[name]);
    if (IDENTIFIERS[name]) return leaf("mi", IDENTIFIERS[name]);
    if (LARGE[name]) return leaf("mo", LARGE[name], { largeop: "true", movablelimits: "true", "data-limits": name.includes("int") ? "false" : "true" });
    if (FUNCTIONS.split(" ").includes(name)) return leaf("mi", name, { mathvariant: "normal" });
    if (LIMITS.split(" ").includes(name)) return leaf("mo", name, { movablelimits: "true", "data-limits": "true" });
    if (SPACES[name]) return node("mspace", [], { width: SPACES[name] });
    if ("{}$%#&_ ".includes(name)) return leaf("mo", name);
    if (name === "\\") return leaf("mspace", "", { linebreak: "newline", "data-row-break": "true" });
    switch (name) {
      case "frac":
      case "dfrac":
      case "tfrac":
        return node("mfrac", [this.argument(), this.argument()]);
      case "binom":
        return node("mrow", [leaf("mo", "("), node("mfrac", [this.argument(), this.argument()], { linethickness: "0" }), leaf("mo", ")")]);
      case "sqrt": {
        this.skipSpace();
        if (this.s[this.i] === "[") {
          this.i++;
          const index = row(this.list(["]"]));
          this.i++;
          return node("mroot", [this.argument(), index]);
        }
        return node("msqrt", [this.argument()]);
      }
      case "text":
      case "textrm":
      case "textbf":
      case "textit":
      case "mbox":
        return leaf("mtext", this.rawGroup());
      case "left":
      case "right":
      case "big":
      case "Big":
      case "bigg":
      case "Bigg": {
        this.skipSpace();
        const d = this.s[this.i] === "\\" ? this.delimiterCommand() : this.s[this.i++];
        return leaf("mo", d === "." ? "" : d, { stretchy: "true", fence: "true" });
      }
      case "begin":
        return this.environment(this.rawGroup());
      case "not":
        return node("mrow", [leaf("mo", "¬"), this.argument()]);
      case "overbrace":
      case "underbrace":
        return node(name === "overbrace" ? "mover" : "munder", [this.argument(), leaf("mo", name === "overbrace" ? "⏞" : "⏟")], { "data-limits": "true" });
      default:
        break;
    }
    if (ACCENTS[name]) return node("mover", [this.argument(), leaf("mo", ACCENTS[name], { stretchy: name.startsWith("wide") || name === "overline" ? "true" : "false" })], { accent: "true" });
    if (FONTS[name]) {
      const arg = this.argument();
      arg.setAttribute("mathvariant", FONTS[name]);
      for (const mi of arg.querySelectorAll("mi")) mi.setAttribute("mathvariant", FONTS[name]);
      return arg;
    }
    const error = node("merror");
    error.append(leaf("mtext", `\\${name}`));
    return error;
  }

  delimiterCommand() {
    this.i++;
    const m = /^([A-Za-z]+|.)/.exec(this.s.slice(this.i));
    this.i += m[0].length;
    return OPERATORS[m[0]] || m[0];
  }

  // \begin{name} … \end{name}: rows split by \\, cells by &.
  environment(name) {
    const rows = [];
    if (name === "array") this.rawGroup();
    let cells = [];
    let cell = [];
    for (;;) {
      cell.push(...this.list(["&", "\\\\", "\\end"]));
      if (this.i >= this.s.length || this.s.startsWith("\\end", this.i)) break;
      if (this.s[this.i] === "&") {
        this.i++;
        cells.push(cell);
        cell = [];
      } else {
        this.i += 2;
        cells.push(cell);
        rows.push(cells);
        cells = [];
        cell = [];
      }
    }
    cells.push(cell);
    if (cells.some((c) => c.length)) rows.push(cells);
    if (this.s.startsWith("\\end", this.i)) {
      this.i += 4;
      this.rawGroup();
    }
    const align = name.startsWith("align") ? "right left" : name === "cases" ? "left left" : "center";
    const table = node(
      "mtable",
      rows.map((r) => node("mtr", r.map((c) => node("mtd", [row(c)])))),
      { columnalign: align },
    );
    const [open, close] = MATRICES[name] || ["", ""];
    const parts = [];
    if (open) parts.push(leaf("mo", open, { stretchy: "true", fence: "true" }));
    parts.push(table);
    if (close) parts.push(leaf("mo", close, { stretchy: "true", fence: "true" }));
    return node("mrow", parts);
  }
}
