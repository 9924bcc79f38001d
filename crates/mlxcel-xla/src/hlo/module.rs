//! Modules and finished functions, and the module's MLIR text.

/// A module: functions rendered in order. Its name is the IREE module's name, so functions are
/// called as `<name>.<function>`.
#[derive(Debug)]
pub struct Module {
    name: String,
    functions: Vec<String>,
}

impl Module {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            functions: Vec::new(),
        }
    }

    pub fn push(&mut self, function: Function) {
        self.functions.push(function.text);
    }

    /// Adds top-level MLIR that is not a StableHLO function: the declaration of an externally
    /// defined executable that functions dispatch to ([`FunctionBuilder::dispatch`]).
    pub fn push_text(&mut self, text: &str) {
        self.functions.push(text.to_owned());
    }

    /// The module's MLIR text.
    pub fn to_text(&self) -> String {
        let mut out = format!("module @{} {{\n", self.name);
        for f in &self.functions {
            out.push_str(f);
        }
        out.push_str("}\n");
        out
    }
}

/// A finished function's text.
#[derive(Debug)]
pub struct Function {
    pub(super) text: String,
}
