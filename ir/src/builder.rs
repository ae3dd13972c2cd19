//! Building functions from Rust with shape inference.
//!
//! Every op added through [`FunctionBuilder`] has its result types inferred by the type rules, so
//! an ill-typed graph is an error at the line that builds it, not later. Names come from the op's
//! mnemonic (or a given name) under the current scope (`block1/conv2d`), made unique.
//!
//! ```
//! use tcc_ir::{DType, FunctionBuilder};
//! let mut b = FunctionBuilder::new("mlp");
//! let x = b.param("x", DType::F32, &[8, 4]).unwrap();
//! let w = b.param("w", DType::F32, &[4, 3]).unwrap();
//! b.push_scope("fc1");
//! let h = b.matmul(x, w).unwrap();
//! let y = b.relu(h).unwrap();
//! b.pop_scope();
//! let f = b.finish(&[y]).unwrap();
//! assert_eq!(f.name(y), "fc1/relu");
//! assert_eq!(f.ty(y).dims(), &[8, 3]);
//! ```

use crate::function::{Function, Op, Value};
use crate::literal::{Literal, Scalar};
use crate::ops::{BinaryOp, CmpOp, Conv2d, OpKind, ReduceOp, UnaryOp};
use crate::types::{DType, TensorType};
use crate::typing::infer;
use std::fmt;

/// An op that could not be built, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildError(pub String);

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BuildError {}

type R<T> = Result<T, BuildError>;

/// Builds one function, op by op, in schedule order.
pub struct FunctionBuilder {
    f: Function,
    scopes: Vec<String>,
}

impl FunctionBuilder {
    /// Starts a function named `name`.
    pub fn new(name: &str) -> FunctionBuilder {
        FunctionBuilder {
            f: Function::new(name),
            scopes: Vec::new(),
        }
    }

    /// Continues building an existing function: new ops are appended to its schedule.
    pub fn from_function(f: Function) -> FunctionBuilder {
        FunctionBuilder {
            f,
            scopes: Vec::new(),
        }
    }

    /// The function so far.
    pub fn function(&self) -> &Function {
        &self.f
    }

    /// Enters a name scope: later names are prefixed with `scope/`.
    pub fn push_scope(&mut self, scope: &str) {
        self.scopes.push(scope.to_string());
    }

    /// Leaves the innermost scope.
    pub fn pop_scope(&mut self) {
        self.scopes.pop();
    }

    fn scoped(&self, name: &str) -> String {
        let mut s = String::new();
        for sc in &self.scopes {
            s.push_str(sc);
            s.push('/');
        }
        s.push_str(name);
        s
    }

    /// Adds a parameter (its name is scoped and made unique).
    pub fn param(&mut self, name: &str, dtype: DType, dims: &[u64]) -> R<Value> {
        let ty = TensorType::new(dtype, dims.to_vec()).map_err(|e| BuildError(e.to_string()))?;
        let name = self.scoped(name);
        Ok(self.f.add_param(&name, ty))
    }

    /// Adds an op, inferring its result types. Results are named `name` (default: the
    /// mnemonic), with `.1`, `.2`... appended to the extra results of multi-result ops.
    pub fn op(&mut self, kind: OpKind, args: &[Value], name: Option<&str>) -> R<Vec<Value>> {
        let arg_types: Vec<&TensorType> = args.iter().map(|&a| self.f.ty(a)).collect();
        let tys = infer(&kind, &arg_types).map_err(|e| {
            BuildError(format!(
                "building `{}` in `@{}`: {e}",
                kind.mnemonic(),
                self.f.name
            ))
        })?;
        let base = self.scoped(name.unwrap_or(kind.mnemonic()));
        let names: Vec<String> = (0..tys.len())
            .map(|i| {
                if i == 0 {
                    base.clone()
                } else {
                    format!("{base}.{i}")
                }
            })
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let op = self.f.add_op(kind, args.to_vec(), tys, &names);
        Ok(self.f.op(op).results.clone())
    }

    /// Adds a single-result op.
    pub fn op1(&mut self, kind: OpKind, args: &[Value]) -> R<Value> {
        Ok(self.op(kind, args, None)?[0])
    }

    /// Adds a single-result op with a name.
    pub fn named(&mut self, name: &str, kind: OpKind, args: &[Value]) -> R<Value> {
        Ok(self.op(kind, args, Some(name))?[0])
    }

    /// The op that defines `v` (panics for parameters).
    pub fn def_op(&self, v: Value) -> Op {
        self.f.def_op(v).expect("value is a parameter")
    }

    /// A constant with every element `x` (converted to `dtype`).
    pub fn splat(&mut self, dtype: DType, dims: &[u64], x: f64) -> R<Value> {
        let ty = TensorType::new(dtype, dims.to_vec()).map_err(|e| BuildError(e.to_string()))?;
        let s = Scalar::from_f64(dtype, x);
        self.op1(
            OpKind::Const {
                ty,
                value: Literal::Splat(s),
            },
            &[],
        )
    }

    /// A constant of the given type and value.
    pub fn constant(&mut self, ty: TensorType, value: Literal) -> R<Value> {
        self.op1(OpKind::Const { ty, value }, &[])
    }

    /// An elementwise unary op.
    pub fn unary(&mut self, op: UnaryOp, x: Value) -> R<Value> {
        self.op1(OpKind::Unary(op), &[x])
    }

    /// An elementwise binary op with broadcasting.
    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> R<Value> {
        self.op1(OpKind::Binary(op), &[a, b])
    }

    /// A comparison with broadcasting.
    pub fn compare(&mut self, op: CmpOp, a: Value, b: Value) -> R<Value> {
        self.op1(OpKind::Compare(op), &[a, b])
    }

    /// `a + b`.
    pub fn add(&mut self, a: Value, b: Value) -> R<Value> {
        self.binary(BinaryOp::Add, a, b)
    }

    /// `a - b`.
    pub fn sub(&mut self, a: Value, b: Value) -> R<Value> {
        self.binary(BinaryOp::Sub, a, b)
    }

    /// `a * b`.
    pub fn mul(&mut self, a: Value, b: Value) -> R<Value> {
        self.binary(BinaryOp::Mul, a, b)
    }

    /// `a / b`.
    pub fn div(&mut self, a: Value, b: Value) -> R<Value> {
        self.binary(BinaryOp::Div, a, b)
    }

    /// `max(x, 0)`.
    pub fn relu(&mut self, x: Value) -> R<Value> {
        self.unary(UnaryOp::Relu, x)
    }

    /// Batched matrix product.
    pub fn matmul(&mut self, a: Value, b: Value) -> R<Value> {
        self.op1(OpKind::MatMul, &[a, b])
    }

    /// 2-D convolution.
    pub fn conv2d(&mut self, x: Value, w: Value, attrs: Conv2d) -> R<Value> {
        self.op1(OpKind::Conv2d(attrs), &[x, w])
    }

    /// A reduction.
    pub fn reduce(&mut self, op: ReduceOp, x: Value, axes: &[i64], keepdims: bool) -> R<Value> {
        self.op1(
            OpKind::Reduce {
                op,
                axes: axes.to_vec(),
                keepdims,
            },
            &[x],
        )
    }

    /// Reshape.
    pub fn reshape(&mut self, x: Value, dims: &[u64]) -> R<Value> {
        self.op1(
            OpKind::Reshape {
                shape: dims.to_vec(),
            },
            &[x],
        )
    }

    /// Transpose.
    pub fn transpose(&mut self, x: Value, perm: &[u64]) -> R<Value> {
        self.op1(
            OpKind::Transpose {
                perm: perm.to_vec(),
            },
            &[x],
        )
    }

    /// Softmax along `axis`.
    pub fn softmax(&mut self, x: Value, axis: i64) -> R<Value> {
        self.op1(OpKind::Softmax { axis }, &[x])
    }

    /// Makes `op` wait for `dep` (a control dependency); `dep` must already be scheduled.
    pub fn add_control_dep(&mut self, op: Op, dep: Op) {
        self.f.op_mut(op).deps.push(dep);
    }

    /// Renames a value (scoped names are not applied); returns the name it got.
    pub fn rename(&mut self, v: Value, name: &str) -> String {
        self.f.rename(v, name)
    }

    /// Gives the function back as it is, without setting results or verifying.
    pub fn into_function(self) -> Function {
        self.f
    }

    /// Finishes the function with the given results.
    pub fn finish(mut self, results: &[Value]) -> R<Function> {
        self.f.set_results(results.to_vec());
        crate::verify::verify_function(&self.f)
            .map_err(|d| BuildError(format!("built function does not verify:\n{d}")))?;
        Ok(self.f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_errors_name_the_op() {
        let mut b = FunctionBuilder::new("f");
        let x = b.param("x", DType::F32, &[2, 3]).unwrap();
        let y = b.param("y", DType::F32, &[4, 5]).unwrap();
        let e = b.matmul(x, y).unwrap_err();
        assert_eq!(
            e.0,
            "building `matmul` in `@f`: inner dims 3 != 4 (f32[2,3] x f32[4,5])"
        );
    }

    #[test]
    fn names_are_scoped_and_unique() {
        let mut b = FunctionBuilder::new("f");
        let x = b.param("x", DType::F32, &[2]).unwrap();
        b.push_scope("blk");
        let a = b.relu(x).unwrap();
        let c = b.relu(a).unwrap();
        b.pop_scope();
        let f = b.finish(&[c]).unwrap();
        assert_eq!(f.name(a), "blk/relu");
        assert_eq!(f.name(c), "blk/relu.1");
    }

    #[test]
    fn multi_result_ops_get_suffixed_names() {
        let mut b = FunctionBuilder::new("f");
        let x = b.param("x", DType::F32, &[2, 3, 4, 4]).unwrap();
        let g = b.param("g", DType::F32, &[3]).unwrap();
        let be = b.param("b", DType::F32, &[3]).unwrap();
        let r = b
            .op(
                OpKind::BatchNormTrain {
                    eps: crate::ops::F64(1e-5),
                },
                &[x, g, be],
                Some("bn"),
            )
            .unwrap();
        let f = b.finish(&r).unwrap();
        let names: Vec<&str> = r.iter().map(|&v| f.name(v)).collect();
        assert_eq!(names, ["bn", "bn.1", "bn.2"]);
        assert_eq!(f.ty(r[1]).dims(), &[3]);
    }
}
