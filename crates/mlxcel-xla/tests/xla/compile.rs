//! Emitted programs compile with the pinned `iree-compile`; its failures are reported in full.

use mlxcel_xla::Error;
use mlxcel_xla::abi::{ProgramShape, WeightFormat};
use mlxcel_xla::hlo::{ElementType, FunctionBuilder, Module, TensorType};
use mlxcel_xla::program::emit_llama;

use crate::{compiler, tiny_dims};

#[test]
fn the_tiny_llama_program_compiles_and_is_cached() {
    let dir = tempfile::tempdir().unwrap();
    let c = compiler(dir.path().to_owned());
    let shape = ProgramShape {
        context_capacity: 16,
        batch: 2,
        chunk: 4,
        min_window: 0,
    };
    for format in [WeightFormat::F32, WeightFormat::F16] {
        let program = emit_llama(&tiny_dims(), &shape, format).unwrap();
        let first = c.compile(&program).unwrap();
        assert!(first.compiled);
        assert!(std::fs::metadata(&first.path).unwrap().len() > 0);
        let again = c.compile(&program).unwrap();
        assert!(!again.compiled, "the second compile hits the cache");
    }
}

#[test]
fn a_compile_failure_shows_iree_compile_s_message_and_the_program_path() {
    let dir = tempfile::tempdir().unwrap();
    let c = compiler(dir.path().to_owned());
    // Well-shaped for the emitter, but `stablehlo.rsqrt` of an integer is refused by the verifier:
    // splice one in by hand.
    let mut f = FunctionBuilder::new("f");
    let x = f.arg(TensorType::new(&[4], ElementType::F32));
    let y = f.add(&x, &x).unwrap();
    let mut m = Module::new("broken");
    m.push(f.finish(&[&y]));
    let text = m.to_text().replace(
        "stablehlo.add %arg0, %arg0",
        "stablehlo.not_an_op %arg0, %arg0",
    );
    let err = c.compile(&text).unwrap_err();
    let Error::CompileFailed {
        program, message, ..
    } = &err
    else {
        panic!("expected CompileFailed, got {err:?}");
    };
    assert!(message.contains("not_an_op"), "{message}");
    let shown = err.to_string();
    assert!(shown.contains(&program.display().to_string()), "{shown}");
    assert_eq!(std::fs::read_to_string(program).unwrap(), text);
}
