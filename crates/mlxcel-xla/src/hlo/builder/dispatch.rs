//! Dispatches of mlxcel's own kernels from inside a function.

use super::FunctionBuilder;
use crate::hlo::types::{TensorType, Value};

impl FunctionBuilder {
    /// A dispatch of `entry` (`@executable::@export`, declared at module level by
    /// [`Module::push_text`](crate::hlo::Module::push_text)) over tensor `operands`, followed by
    /// `constants` as `index` operands, which are also the dispatch's workload. The executable's
    /// signature is not visible here: the caller matches it.
    pub fn dispatch(
        &mut self,
        entry: &str,
        operands: &[&Value],
        constants: &[i64],
        result: TensorType,
    ) -> Value {
        let mut results = self.dispatch_results(entry, operands, constants, &[result]);
        results.pop().expect("one result")
    }

    /// [`Self::dispatch`] with several results (at least one).
    pub fn dispatch_results(
        &mut self,
        entry: &str,
        operands: &[&Value],
        constants: &[i64],
        results: &[TensorType],
    ) -> Vec<Value> {
        let mut names = Vec::with_capacity(constants.len());
        for c in constants {
            let name = format!("%c{}", self.next);
            self.next += 1;
            self.line(format!("{name} = arith.constant {c} : index"));
            names.push(name);
        }
        let workload = names.join(", ");
        let args = operands
            .iter()
            .map(|v| v.to_string())
            .chain(names.iter().cloned())
            .collect::<Vec<_>>()
            .join(", ");
        let types = operands
            .iter()
            .map(|v| v.ty.to_string())
            .chain(names.iter().map(|_| "index".to_owned()))
            .collect::<Vec<_>>()
            .join(", ");
        let base = format!("%{}", self.next);
        self.next += 1;
        let result_types = results
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let (lhs, out_types, values) = if results.len() == 1 {
            let v = Value {
                name: base.clone(),
                ty: results[0].clone(),
            };
            (base, result_types, vec![v])
        } else {
            let values = results
                .iter()
                .enumerate()
                .map(|(i, t)| Value {
                    name: format!("{base}#{i}"),
                    ty: t.clone(),
                })
                .collect();
            (
                format!("{base}:{}", results.len()),
                format!("({result_types})"),
                values,
            )
        };
        self.line(format!(
            "{lhs} = flow.dispatch {entry}[{workload}]({args}) : ({types}) -> {out_types}"
        ));
        values
    }
}
