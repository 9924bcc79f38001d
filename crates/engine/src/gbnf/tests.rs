use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use super::ast::{Alternatives, Item, Sequence};
use super::gbnf_to_lark;
use super::grammar::Grammar;
use super::parser::Parser;

/// A factory over a toy vocabulary: one token per byte, and an end-of-sequence token.
fn byte_factory() -> ParserFactory {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    words.push(b"\xFF<eos>".to_vec());
    let trie = TokTrie::from(&TokRxInfo::new(257, 256), &words);
    let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
    let mut factory = ParserFactory::new_simple(&env).expect("a byte vocabulary is valid");
    factory.quiet();
    factory
}

/// Converts `gbnf` and compiles the Lark with llguidance; panics with both texts if either
/// step fails.
fn compile(factory: &ParserFactory, gbnf: &str) -> Matcher {
    let lark = gbnf_to_lark(gbnf).unwrap_or_else(|e| panic!("{e}\nin:\n{gbnf}"));
    let parser = factory
        .create_parser(TopLevelGrammar::from_lark(lark.clone()))
        .unwrap_or_else(|e| panic!("llguidance refuses the Lark: {e}\n{lark}"));
    let matcher = Matcher::new(Ok(parser));
    assert!(
        matcher.get_error().is_none(),
        "{:?}\n{lark}",
        matcher.get_error()
    );
    matcher
}

/// Whether the constraint compiled from `gbnf` takes `text` byte by byte and can end there.
fn accepts(factory: &ParserFactory, gbnf: &str, text: &str) -> bool {
    let mut matcher = compile(factory, gbnf);
    for &byte in text.as_bytes() {
        if matcher.consume_token(u32::from(byte)).is_err() {
            return false;
        }
    }
    matcher.is_accepting().unwrap_or(false)
}

/// Each grammar with text it must accept and text it must reject.
const LANGUAGES: &[(&str, &str, &[&str], &[&str])] = &[
    (
        "arithmetic",
        r#"root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
"#,
        &["1", "12+3", "(1+2)*3", "((4))/5-6"],
        &["", "+1", "1+", "(1", "1)", "a"],
    ),
    (
        "JSON-like",
        r#"root ::= value
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws (member ("," ws member)*)? "}"
member ::= string ws ":" ws value ws
array ::= "[" ws (value ws ("," ws value ws)*)? "]"
string ::= "\"" ([^"\\\x00-\x1F] | "\\" ["\\/bfnrt])* "\""
number ::= "-"? [0-9]+ ("." [0-9]+)?
ws ::= [ \t\n]*
"#,
        &[
            r#"{"a": [1, 2.5, -3], "b": {"c": null}}"#,
            r#"[true, false, "x\"y\\z"]"#,
            "\"é ✓\"",
            "{}",
        ],
        &[r#"{"a" 1}"#, "[1,]", "tru", "\"a\nb\"", "01.", "{'a': 1}"],
    ),
    (
        "list",
        "root ::= (\"- \" item \"\\n\")+\nitem ::= [^\\n]+\n",
        &["- a\n", "- one\n- two words\n"],
        &["", "- \n", "- a", "* a\n"],
    ),
    (
        "character classes with escapes",
        r#"root ::= [\x41-\x43] [\u00e9\u4E00] [\U0001F600] [\-\]\[\\] [^\t\n\r] [a-]"#,
        &["Aé😀-xa", "C一😀]\u{7f}-", "B一😀[ a", "Aé😀\\/-"],
        &["Dé😀-xa", "Ae😀-xa", "Aé😀-\ta", "Aé😀^xa", "Aé😀-xb"],
    ),
    (
        "repetition bounds",
        r#"root ::= "a"{2} "b"{1,} "c"{0,2} "d"{1,3} "e"{0} ("fg"){2}"#,
        &["aabdfgfg", "aabbbccdddfgfg", "aabcdfgfg"],
        &[
            "abdfgfg",
            "aadfgfg",
            "aabcccdfgfg",
            "aabddddfgfg",
            "aabdefgfg",
            "aabdfg",
        ],
    ),
    (
        "stacked repetitions",
        r#"root ::= ("ab"?)+ "c"+? "x"*"#,
        &["", "abab", "ababc", "cccxx", "x"],
        &["a", "abb", "ba"],
    ),
    (
        "comments and multi-line rules",
        "# a comment before the rules\n\nroot ::= greeting # after a rule\n  \
         \ngreeting ::=\n    ( # inside a group\n      \"hi\"\n    | \"hello\"\n    \
         ) \" \" name\nname ::= \"you\" |\n  \"world\" # an alternative after `|`\n",
        &["hi you", "hello world"],
        &["hi", "hello  world", "hiworld"],
    ),
    (
        "a keyword next to an identifier",
        // A lexer would take `re`/`ret` as the start of `return` and reject `result` and
        // `ret`; GBNF accepts both.
        r#"root ::= ("return" | ident) " " ident
ident ::= [a-z] [a-z]*
"#,
        &["return x", "result x", "ret x", "r x"],
        &["return", "returnx", " x"],
    ),
    (
        "a literal that is a prefix of another",
        r#"root ::= ("a" | "ab") "bc" | "abc" "d""#,
        &["abc", "abbc", "abcd"],
        &["ab", "abcbc"],
    ),
    (
        "any character",
        r#"root ::= "<" .* ">" ."#,
        &["<>x", "<a\nb>\n", "<<>>>", "<é>😀"],
        &["<>", "<x", "x<>y"],
    ),
    (
        "empty alternatives",
        r#"root ::= "x" opt "y"
opt ::= | "-" |"+""#,
        &["xy", "x-y", "x+y"],
        &["x--y", "x"],
    ),
    (
        "rule names to map",
        r#"root ::= Start start the-end 9lives
Start ::= "A"
start ::= "b"
the-end ::= "c"
9lives ::= "d" | "9" 9lives
"#,
        &["Abcd", "Abc99d"],
        &["abcd", "Abc"],
    ),
    (
        "one-character rules",
        r#"root ::= (ch | pair)+
ch ::= [^a-z] | "q" | any-nl | cyc
any-nl ::= "\n"
pair ::= "ab"
cyc ::= cyc2 | "r"
cyc2 ::= cyc | "s"
"#,
        &["q", "1\nq", "ab", "rs", "😀Q"],
        &["b", "a", ""],
    ),
    (
        "classes of no character",
        r#"root ::= "a" | [^\x00-\U0010FFFF] "b" | none "c"
none ::= [^\x00-\U0010FFFF] | [^\x00-\U0010FFFF]
"#,
        &["a"],
        &["b", "c", "ab", ""],
    ),
    (
        "any character in a choice",
        r#"root ::= (. | "x") "!""#,
        &["\n!", "x!", "é!"],
        &["!", "xx!"],
    ),
    (
        "left recursion",
        r#"root ::= root "a" | "b""#,
        &["b", "baaa"],
        &["", "ab"],
    ),
    (
        "CRLF line ends",
        "root ::= a\r\na ::= \"x\" |\r\n  \"y\"\r\n",
        &["x", "y"],
        &["xy"],
    ),
];

#[test]
fn gbnf_grammars_accept_what_llama_cpp_accepts() {
    let factory = byte_factory();
    for (name, gbnf, accepted, rejected) in LANGUAGES {
        for text in *accepted {
            assert!(
                accepts(&factory, gbnf, text),
                "{name}: rejects {text:?}\n{}",
                gbnf_to_lark(gbnf).unwrap_or_default()
            );
        }
        for text in *rejected {
            assert!(
                !accepts(&factory, gbnf, text),
                "{name}: accepts {text:?}\n{}",
                gbnf_to_lark(gbnf).unwrap_or_default()
            );
        }
    }
}

#[test]
fn gbnf_lark_output_spells_each_construct() {
    let lark = gbnf_to_lark(
        "root ::= \"a\\\"\\\\\\n\" [^a-z\\x2F\\]] . my-rule{2,} <[7]> !<[8]> <think>\n\
         my-rule ::= (\"x\" | ) \"\"",
    )
    .unwrap();
    assert_eq!(
        lark,
        "start: root\n\
         root: \"a\" \"\\\"\" \"\\\\\" \"\\u000a\" /[^a-z\\/\\]]/ /(?s:.)/ my_rule{2,} \
         <[7]> <[^8]> <think>\n\
         my_rule: (\"x\" | \"\")\n"
    );
}

#[test]
fn gbnf_rule_names_map_to_distinct_lark_names() {
    let lark = gbnf_to_lark(
        "root ::= Ws ws-1 WS-1 ws-1-2 start 2x\nWs ::= \"a\" \"a\"\nws-1 ::= \"b\" \"b\"\n\
         WS-1 ::= \"c\" \"c\"\nws-1-2 ::= \"d\" \"d\"\nstart ::= \"e\" \"e\"\n\
         2x ::= \"f\" \"f\"\n",
    )
    .unwrap();
    assert_eq!(
        lark,
        "start: root\n\
         root: ws ws_1 ws_1_3 ws_1_2 start_2 r2x\n\
         ws: \"a\" \"a\"\nws_1: \"b\" \"b\"\nws_1_3: \"c\" \"c\"\nws_1_2: \"d\" \"d\"\n\
         start_2: \"e\" \"e\"\nr2x: \"f\" \"f\"\n"
    );
}

#[test]
fn gbnf_one_character_choices_become_one_regex() {
    let lark = gbnf_to_lark(
        "root ::= ch+ (\"x\" | [yz])\nch ::= letter | digit | [_-]\n\
         letter ::= [a-z] | [A-Z]\ndigit ::= [0-9]\nloop ::= loop | \"a\"\n",
    )
    .unwrap();
    assert_eq!(
        lark,
        "start: root\n\
         root: /[\\-0-9A-Z\\_a-z]/+ /[x-z]/\n\
         ch: /[\\-0-9A-Z\\_a-z]/\n\
         letter: /[A-Za-z]/\n\
         digit: /[0-9]/\n\
         loop: loop | \"a\"\n"
    );
}

#[test]
fn gbnf_later_definition_replaces_earlier_as_in_llama_cpp() {
    let factory = byte_factory();
    let gbnf = "root ::= a\na ::= \"x\"\na ::= \"y\"\n";
    assert!(accepts(&factory, gbnf, "y"));
    assert!(!accepts(&factory, gbnf, "x"));
}

#[test]
fn gbnf_deep_groups_become_rules() {
    let depth = 40;
    let gbnf = format!("root ::= {}\"x\"{}\n", "(".repeat(depth), ")".repeat(depth));
    let factory = byte_factory();
    assert!(accepts(&factory, &gbnf, "x"));
    assert!(!accepts(&factory, &gbnf, "xx"));
}

#[test]
fn gbnf_repetition_limits_follow_llama_cpp() {
    let factory = byte_factory();
    // A maximum over 2000 means no maximum, as in llama.cpp.
    let unbounded = r#"root ::= "a"{1,5000}"#;
    assert!(accepts(&factory, unbounded, &"a".repeat(5001)));
    assert!(
        gbnf_to_lark(r#"root ::= "a"{2001}"#)
            .unwrap_err()
            .contains("exceeds llama.cpp's limit of 2000")
    );
}

#[test]
fn gbnf_token_ids_match_tokens() {
    let factory = byte_factory();
    // In the byte vocabulary token 97 is `a`.
    assert!(accepts(&factory, "root ::= <[97]> \"b\"", "ab"));
    assert!(!accepts(&factory, "root ::= <[97]> \"b\"", "bb"));
    assert!(accepts(&factory, "root ::= !<[97]> \"b\"", "cb"));
    assert!(!accepts(&factory, "root ::= !<[97]> \"b\"", "ab"));
}

/// Each malformed grammar, the line and column of the error, and a part of its message.
const ERRORS: &[(&str, &str)] = &[
    (
        "root ::= \"abc",
        "line 1, column 10: unterminated string literal",
    ),
    (
        "root ::= [abc",
        "line 1, column 10: unterminated character class",
    ),
    ("root ::= []", "line 1, column 10: empty character class"),
    (
        "root ::= [z-a]",
        "line 1, column 11: the range `z-a` is reversed",
    ),
    ("root ::= foo\n", "line 1, column 10: unknown rule `foo`"),
    (
        "a ::= \"x\"\nroot ::= a b-c\n",
        "line 2, column 12: unknown rule `b-c`",
    ),
    (
        "a ::= \"x\"\n",
        "line 1, column 1: the grammar has no `root` rule",
    ),
    (
        "# only a comment\n",
        "line 1, column 1: the grammar is empty",
    ),
    (
        "root = \"x\"",
        "line 1, column 6: expected `::=` after the rule name `root`",
    ),
    (
        "root ::= \"x\"\n::= \"y\"",
        "line 2, column 1: expected a rule name",
    ),
    (
        "root ::= (\"x\"",
        "line 1, column 10: this group is never closed",
    ),
    (
        "root ::= (\"x\" ]",
        "line 1, column 15: unexpected `]` in the group opened at line 1, column 10",
    ),
    (
        "root ::= \"x\" )",
        "line 1, column 14: unexpected `)` in rule `root`",
    ),
    (
        "root ::= \"x\"\n  | \"y\"",
        "line 2, column 3: expected a rule name",
    ),
    (
        "root ::= * \"x\"",
        "line 1, column 10: `*` must follow something to repeat",
    ),
    (
        "root ::= \"x\"{,3}",
        "line 1, column 14: expected a number after `{`",
    ),
    (
        "root ::= \"x\"{3;}",
        "line 1, column 15: expected `,` or `}`",
    ),
    (
        "root ::= \"x\"{1,2",
        "line 1, column 17: expected `}` to end the repetition",
    ),
    (
        "root ::= \"x\"{3,2}",
        "line 1, column 13: the repetition `{3,2}` has its maximum below its minimum",
    ),
    (
        "root ::= \"\\q\"",
        "line 1, column 11: unknown escape `\\q`",
    ),
    (
        "root ::= \"\\x4\"",
        "line 1, column 11: `\\x` needs 2 hexadecimal digits",
    ),
    (
        "root ::= \"\\uD800\"",
        "line 1, column 11: U+D800 is not a Unicode scalar value",
    ),
    (
        "root ::= [\\U00110000]",
        "line 1, column 11: U+110000 is not a Unicode scalar value",
    ),
    (
        "root ::= !<think>",
        "line 1, column 10: `!<think>` (any token but one named by its text)",
    ),
    (
        "root ::= <a b>",
        "line 1, column 10: the token `<a b>` cannot be passed to llguidance",
    ),
    (
        "root ::= <[x]>",
        "line 1, column 12: expected a token id after `<[`",
    ),
    (
        "root ::= <[99999999999]>",
        "line 1, column 12: token id 99999999999 is too large",
    ),
    ("root ::= <[1>", "line 1, column 13: expected `]>`"),
    ("root ::= <abc", "line 1, column 10: unterminated token"),
    (
        "root ::= !\"x\"",
        "line 1, column 11: expected `<` after `!`",
    ),
    (
        "root ::= \"é\" \"x\" @",
        "line 1, column 18: unexpected `@` in rule `root`",
    ),
    (
        "root ::= \"x\"\n\nfoo ::= \"y\" bar",
        "line 3, column 13: unknown rule `bar`",
    ),
];

#[test]
fn gbnf_nesting_is_bounded() {
    let groups = format!("root ::= {}\"x\"{}", "(".repeat(101), ")".repeat(101));
    assert!(
        gbnf_to_lark(&groups)
            .unwrap_err()
            .starts_with("line 1, column 110: groups are nested more than 100 deep")
    );
    let deep = format!(
        "root ::= {}\"x\"{}",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    assert!(gbnf_to_lark(&deep).is_err());
    let repeats = format!("root ::= \"x\"{}", "?".repeat(101));
    assert!(
        gbnf_to_lark(&repeats)
            .unwrap_err()
            .starts_with("line 1, column 113: repetitions are nested more than 100 deep")
    );
    let mixed = format!("root ::= {}\"x\"{}", "(".repeat(60), ")?".repeat(60));
    assert!(
        gbnf_to_lark(&mixed)
            .unwrap_err()
            .contains("groups and repetitions are nested more than 100 deep")
    );
    let within = format!("root ::= {}\"x\"{}", "(".repeat(50), ")?".repeat(49));
    assert!(gbnf_to_lark(&format!("{within})")).is_ok());
}

#[test]
fn gbnf_errors_name_line_column_and_cause() {
    for (gbnf, expected) in ERRORS {
        let error = gbnf_to_lark(gbnf).expect_err(gbnf);
        assert!(
            error.starts_with(expected),
            "{gbnf:?}:\n  got      {error}\n  expected {expected}"
        );
    }
}

/// A recognizer for the parsed grammar, written straight from GBNF's meaning (the positions
/// where each item can end), as the oracle for the compiled constraint. Grammars given to it
/// must not be left-recursive.
struct Reference {
    rules: HashMap<String, Alternatives>,
}

impl Reference {
    fn new(gbnf: &str) -> Self {
        let mut parser = Parser::new(gbnf);
        let definitions = parser.grammar().expect("the grammar parses");
        let grammar = Grammar::resolve(definitions, &parser).expect("the grammar resolves");
        Self {
            rules: grammar.rules.into_iter().collect(),
        }
    }

    fn accepts(&self, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        self.alternatives(&self.rules["root"], &text, 0)
            .contains(&text.len())
    }

    fn alternatives(&self, alternatives: &[Sequence], text: &[char], at: usize) -> BTreeSet<usize> {
        alternatives
            .iter()
            .flat_map(|sequence| {
                sequence.iter().fold(BTreeSet::from([at]), |ends, item| {
                    ends.iter()
                        .flat_map(|&end| self.item(item, text, end))
                        .collect()
                })
            })
            .collect()
    }

    fn item(&self, item: &Item, text: &[char], at: usize) -> BTreeSet<usize> {
        let next = text.get(at).copied();
        match item {
            Item::Literal(chars) if text[at..].starts_with(chars) => {
                BTreeSet::from([at + chars.len()])
            }
            Item::Literal(_) => BTreeSet::new(),
            Item::Class { negated, ranges } => match next {
                Some(c) if ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated => {
                    BTreeSet::from([at + 1])
                }
                _ => BTreeSet::new(),
            },
            Item::AnyChar if next.is_some() => BTreeSet::from([at + 1]),
            Item::AnyChar => BTreeSet::new(),
            Item::Rule { name, .. } => self.alternatives(&self.rules[name], text, at),
            Item::Group(alternatives) => self.alternatives(alternatives, text, at),
            Item::Token(_) => panic!("the reference has no tokens"),
            Item::Repeat { item, min, max } => {
                // Ends after exactly `count` repetitions, until the count reaches `max` or
                // adds no new end.
                let mut current = BTreeSet::from([at]);
                let mut ends = BTreeSet::new();
                let mut count = 0;
                loop {
                    if count >= *min {
                        let before = ends.len();
                        ends.extend(current.iter().copied());
                        if count > *min && ends.len() == before {
                            break;
                        }
                    }
                    if current.is_empty() || max.is_some_and(|max| count >= max) {
                        break;
                    }
                    current = current
                        .iter()
                        .flat_map(|&end| self.item(item, text, end))
                        .collect();
                    count += 1;
                }
                ends
            }
        }
    }
}

/// Grammars with the pieces their random texts are made of.
const DIFFERENTIAL: &[(&str, &[&str])] = &[
    (
        "root ::= (\"return\" | \"re\" | ident) \" \" ident\nident ::= [a-z]+\n",
        &["return", "ret", "re", "r", "u", " ", "x"],
    ),
    (
        "root ::= expr\nexpr ::= term ([-+] term)*\nterm ::= [0-9]+ | \"(\" expr \")\"\n",
        &["1", "23", "+", "-", "(", ")"],
    ),
    (
        "root ::= (\"a\" | \"ab\" | \"abc\")* \"b\"?",
        &["a", "b", "c", "ab", "abc"],
    ),
    (
        "root ::= ws (item (\",\" ws item)*)? ws\n\
         item ::= [0-9] | [1-9] [0-9]{0,2}\nws ::= | \" \" | \"\\n\" [ \\t]{0,2}\n",
        &[",", " ", "0", "15", "\n", "\t"],
    ),
    (
        "root ::= (\"ab\"{1,2} \"c\"?){2,3} .?",
        &["ab", "abc", "a", "c", "x"],
    ),
    (
        "root ::= ([^a-c] | \"é\" \"b\"?)+ | \"😀\"{2}",
        &["a", "b", "é", "😀", "x"],
    ),
    (
        "root ::= (\"\" | \"a\" | x)* \"b\"\nx ::= \"a\"? \"c\"{0,1}\n",
        &["a", "b", "c"],
    ),
    (
        "root ::= word (sep word)*\nword ::= letter+\nletter ::= [a-c] | \"-\"\nsep ::= [ ,]",
        &["ab", "-", " ", ",", "c"],
    ),
];

/// The compiled constraint accepts exactly the texts the reference accepts; each grammar's
/// random texts include both kinds.
#[test]
fn gbnf_constraint_agrees_with_a_reference_recognizer() {
    use std::cell::Cell;

    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRng, TestRunner};

    let factory = byte_factory();
    for (gbnf, pieces) in DIFFERENTIAL {
        let matcher = compile(&factory, gbnf);
        let reference = Reference::new(gbnf);
        let texts = proptest::collection::vec(proptest::sample::select(pieces.to_vec()), 0..8);
        // A fixed seed: the same texts every run, so that the counts below cannot flake.
        let config = Config {
            cases: 300,
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::deterministic_rng(config.rng_algorithm);
        let mut runner = TestRunner::new_with_rng(config, rng);
        let (accepted, rejected) = (Cell::new(0), Cell::new(0));
        let outcome = runner.run(&texts, |pieces| {
            let text = pieces.concat();
            let mut fresh = matcher.deep_clone();
            let taken = text
                .bytes()
                .all(|byte| fresh.consume_token(u32::from(byte)).is_ok());
            let ours = taken && fresh.is_accepting().unwrap_or(false);
            let expected = reference.accepts(&text);
            let counter = if expected { &accepted } else { &rejected };
            counter.set(counter.get() + 1);
            prop_assert_eq!(ours, expected, "text {:?}", text);
            Ok(())
        });
        let lark = gbnf_to_lark(gbnf).unwrap_or_default();
        if let Err(failure) = outcome {
            panic!("{failure}\ngrammar:\n{gbnf}\nLark:\n{lark}");
        }
        assert!(
            accepted.get() >= 10 && rejected.get() >= 10,
            "{} accepted and {} rejected texts: not a test of\n{gbnf}",
            accepted.get(),
            rejected.get()
        );
    }
}

/// Every grammar llama.cpp ships, from the folder in `GBNF_GRAMMARS_DIR`: it converts,
/// llguidance compiles it, and the constraint accepts the sample output
/// `tests/gbnf_grammars/samples/<name>.txt`. Run by scripts/check-gbnf, which fetches the
/// grammars; one line per grammar.
#[test]
#[ignore = "needs llama.cpp's grammars folder: scripts/check-gbnf"]
fn gbnf_llama_cpp_grammars_compile_and_accept_samples() {
    let Some(dir) = std::env::var_os("GBNF_GRAMMARS_DIR") else {
        panic!("set GBNF_GRAMMARS_DIR to llama.cpp's grammars folder (scripts/check-gbnf does)");
    };
    let samples =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gbnf_grammars/samples");
    let mut grammars: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.to_string_lossy()))
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "gbnf"))
        .collect();
    grammars.sort();
    assert!(
        !grammars.is_empty(),
        "no .gbnf file in {}",
        dir.to_string_lossy()
    );
    let factory = byte_factory();
    let mut failures = 0;
    for path in &grammars {
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        let outcome = check_grammar(&factory, path, &samples.join(format!("{name}.txt")));
        match outcome {
            Ok(detail) => println!("ok      {name}.gbnf: {detail}"),
            Err(why) => {
                failures += 1;
                println!("FAILED  {name}.gbnf: {why}");
            }
        }
    }
    assert_eq!(
        failures,
        0,
        "{failures} of {} grammars failed",
        grammars.len()
    );
}

fn check_grammar(
    factory: &ParserFactory,
    grammar: &std::path::Path,
    sample: &std::path::Path,
) -> Result<String, String> {
    let gbnf = std::fs::read_to_string(grammar).map_err(|e| format!("cannot read: {e}"))?;
    let lark = gbnf_to_lark(&gbnf).map_err(|e| format!("not converted: {e}"))?;
    let parser = factory
        .create_parser(TopLevelGrammar::from_lark(lark.clone()))
        .map_err(|e| format!("llguidance refuses the Lark: {e}"))?;
    let mut matcher = Matcher::new(Ok(parser));
    if let Some(error) = matcher.get_error() {
        return Err(format!("llguidance refuses the Lark: {error}"));
    }
    let text = std::fs::read_to_string(sample)
        .map_err(|e| format!("no sample {}: {e}", sample.display()))?;
    for (offset, &byte) in text.as_bytes().iter().enumerate() {
        matcher.consume_token(u32::from(byte)).map_err(|e| {
            let line = text[..offset].matches('\n').count() + 1;
            let first_line = e.to_string().lines().next().unwrap_or_default().to_string();
            format!("the sample is rejected at byte {offset} (line {line}): {first_line}")
        })?;
    }
    if !matcher.is_accepting().unwrap_or(false) {
        return Err("the sample is an incomplete output".into());
    }
    Ok(format!(
        "converted ({} Lark lines), compiled, accepts the {}-byte sample",
        lark.lines().count(),
        text.len()
    ))
}
