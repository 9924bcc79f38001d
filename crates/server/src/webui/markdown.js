// Markdown to DOM for the chat page: fenced code (highlighted), headings, lists, quotes, tables,
// rules, paragraphs; inline code, emphasis, strike-through, links and TeX math. The renderer
// builds elements with createElement and puts every piece of the text in through text nodes, so
// markup in a model's answer stays text: it never parses HTML. Links keep only http(s) and
// mailto targets.
import { highlight } from "./highlight.js";
import { renderTex } from "./math.js";

const el = (tag, className) => {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
};

// Block-level rules, tried in order on the line where a block starts.
const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_SEPARATOR = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const DISPLAY_MATH_OPEN = /^\s*(\$\$|\\\[)(.*)$/;

/** Renders `text` as markdown into a new `<div>`; an unclosed fence or formula (a reply still
 * streaming) renders as far as it got. */
export function renderMarkdown(text) {
  const root = el("div", "markdown");
  renderBlocks(text.replace(/\r\n?/g, "\n").split("\n"), root);
  return root;
}

function renderBlocks(lines, parent) {
  let i = 0;
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) {
      const p = el("p");
      renderInline(paragraph.join("\n"), p);
      parent.append(p);
      paragraph = [];
    }
  };
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) {
      flush();
      i++;
    } else if ((m = FENCE.exec(line))) {
      flush();
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence)) body.push(lines[i++]);
      i++;
      parent.append(codeBlock(body.join("\n"), m[2].toLowerCase()));
    } else if ((m = DISPLAY_MATH_OPEN.exec(line))) {
      flush();
      const close = m[1] === "$$" ? "$$" : "\\]";
      let source = m[2];
      let end = source.indexOf(close);
      if (end < 0) {
        const body = [source];
        i++;
        while (i < lines.length && lines[i].indexOf(close) < 0) body.push(lines[i++]);
        if (i < lines.length) body.push(lines[i].slice(0, lines[i].indexOf(close)));
        source = body.join("\n");
      } else {
        source = source.slice(0, end);
      }
      i++;
      const block = el("div", "math-display");
      block.append(renderTex(source, true));
      parent.append(block);
    } else if ((m = HEADING.exec(line))) {
      flush();
      const h = el(`h${m[1].length}`);
      renderInline(m[2], h);
      parent.append(h);
      i++;
    } else if (RULE.test(line)) {
      flush();
      parent.append(el("hr"));
      i++;
    } else if (QUOTE.test(line)) {
      flush();
      const body = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
        body.push(m[1]);
        i++;
      }
      const quote = el("blockquote");
      renderBlocks(body, quote);
      parent.append(quote);
    } else if (ITEM.test(line) && (!paragraph.length || !/^\s/.test(line))) {
      flush();
      i = renderList(lines, i, parent);
    } else if (line.includes("|") && i + 1 < lines.length && TABLE_SEPARATOR.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      flush();
      i = renderTable(lines, i, parent);
    } else {
      paragraph.push(line);
      i++;
    }
  }
  flush();
}

function codeBlock(source, language) {
  const pre = el("pre");
  const code = el("code", language ? `language-${language}` : "");
  code.append(highlight(source, language));
  pre.append(code);
  const copy = el("button", "copy-code");
  copy.type = "button";
  copy.textContent = "Copy";
  copy.dataset.copy = "code";
  pre.append(copy);
  return pre;
}

// A list and the lines that belong to it: items at its indentation, and more-indented lines
// (nested lists, continued text) inside the item above them.
function renderList(lines, start, parent) {
  const first = ITEM.exec(lines[start]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  let i = start;
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const body = [m[3]];
    i++;
    while (i < lines.length) {
      const line = lines[i];
      const lead = line.length - line.trimStart().length;
      if (line.trim() && lead > indent) {
        body.push(line.slice(Math.min(lead, indent + 2)));
      } else if (!line.trim() && i + 1 < lines.length && lines[i + 1].length - lines[i + 1].trimStart().length > indent) {
        body.push("");
      } else {
        break;
      }
      i++;
    }
    const item = el("li");
    if (body.length === 1) {
      renderInline(body[0], item);
    } else {
      renderBlocks(body, item);
      // A tight item's text reads as a line of the list, not a paragraph.
      const p = item.firstElementChild;
      if (p && p.tagName === "P" && !body.includes("")) p.replaceWith(...p.childNodes);
    }
    list.append(item);
    if (i < lines.length && !lines[i].trim() && i + 1 < lines.length && ITEM.test(lines[i + 1])) i++;
  }
  parent.append(list);
  return i;
}

function tableCells(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  return row.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

function renderTable(lines, start, parent) {
  const table = el("table");
  const aligns = tableCells(lines[start + 1]).map((c) =>
    c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : "",
  );
  const row = (cells, tag) => {
    const tr = el("tr");
    cells.forEach((text, k) => {
      const cell = el(tag);
      if (aligns[k]) cell.className = `align-${aligns[k]}`;
      renderInline(text, cell);
      tr.append(cell);
    });
    return tr;
  };
  const head = el("thead");
  head.append(row(tableCells(lines[start]), "th"));
  const body = el("tbody");
  let i = start + 2;
  while (i < lines.length && lines[i].includes("|") && lines[i].trim()) body.append(row(tableCells(lines[i++]), "td"));
  table.append(head, body);
  const wrap = el("div", "table-wrap");
  wrap.append(table);
  parent.append(wrap);
  return i;
}

// Inline rules: the earliest match wins; text between matches is a text node.
const INLINE = [
  { re: /(`+)([\s\S]*?[^`])\1(?!`)/, make: (m) => textIn("code", m[2].replace(/^ (.*) $/, "$1")) },
  { re: /\$\$([\s\S]+?)\$\$/, make: (m) => mathIn(m[1], true) },
  { re: /\\\(([\s\S]+?)\\\)/, make: (m) => mathIn(m[1], false) },
  { re: /\\\[([\s\S]+?)\\\]/, make: (m) => mathIn(m[1], true) },
  // $x$ is math when the dollars hug the formula ($5 and $10 stays text).
  { re: /\$(?![\s$])((?:\\\$|[^$\n])+?)(?<![\s\\])\$(?!\d)/, make: (m) => mathIn(m[1], false) },
  { re: /!?\[([^\]\n]*)\]\(\s*<?([^\s)>]*)>?(?:\s+"[^"]*")?\s*\)/, make: (m) => link(m[1], m[2]) },
  { re: /<(https?:\/\/[^\s>]+)>/, make: (m) => link(m[1], m[1]) },
  { re: /\*\*(?=\S)([\s\S]*?\S)\*\*/, make: (m) => nested("strong", m[1]) },
  // Underscores emphasize only at word edges (snake_case and __dunder__ inside words stay text).
  { re: /(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)/, make: (m) => nested("strong", m[1]) },
  { re: /~~(?=\S)([\s\S]*?\S)~~/, make: (m) => nested("del", m[1]) },
  { re: /(?<![\w*])\*(?=[^\s*])([\s\S]*?[^\s*])\*(?!\*)/, make: (m) => nested("em", m[1]) },
  { re: /(?<![\w_])_(?=[^\s_])([\s\S]*?[^\s_])_(?![\w_])/, make: (m) => nested("em", m[1]) },
  { re: /\\([\\`*_{}[\]()#+\-.!|~$<>])/, make: (m) => document.createTextNode(m[1]) },
  { re: / {2,}\n|\\\n/, make: () => el("br") },
];

function renderInline(text, parent) {
  let rest = text;
  while (rest) {
    let best = null;
    for (const rule of INLINE) {
      const m = rule.re.exec(rest);
      if (m && (!best || m.index < best.m.index)) best = { m, rule };
    }
    if (!best) {
      parent.append(document.createTextNode(rest));
      return;
    }
    if (best.m.index) parent.append(document.createTextNode(rest.slice(0, best.m.index)));
    parent.append(best.rule.make(best.m));
    rest = rest.slice(best.m.index + best.m[0].length);
  }
}

function textIn(tag, text) {
  const node = el(tag);
  node.textContent = text;
  return node;
}

function nested(tag, text) {
  const node = el(tag);
  renderInline(text, node);
  return node;
}

function mathIn(source, display) {
  const span = el("span", display ? "math-display" : "math-inline");
  span.append(renderTex(source, display));
  return span;
}

/** Whether `href` is a link target the page follows: http(s) and mailto only, so that a
 * `javascript:` or `data:` link in a reply stays text. */
export function safeHref(href) {
  try {
    const url = new URL(href, "http://invalid.invalid/");
    return ["http:", "https:", "mailto:"].includes(url.protocol) && url.host !== "invalid.invalid";
  } catch {
    return false;
  }
}

function link(label, href) {
  if (!safeHref(href)) return document.createTextNode(label ? `${label} (${href})` : href);
  const a = el("a");
  a.href = href;
  a.rel = "noopener noreferrer";
  a.target = "_blank";
  renderInline(label || href, a);
  return a;
}
