//! The expression form of a kernel body: what one element (or one vector of elements) of a
//! loop computes from its arguments, as a list of nodes in evaluation order.
//!
//! A [`Body`] has numbered arguments (the loaded operands, an accumulator, a row's maximum) and
//! results. Nodes are typed by [`Class`]: numbers of the body's [`Lane`] (`f32`, `f64`, or
//! `i32`, which also computes `i8`/`u8` values, widened when loaded and wrapped after each op),
//! 32-bit integers (the exponent bit tricks of `exp` and `log` in float bodies), and masks
//! (comparison results, consumed by `select`). The arithmetic nodes mean the same for every
//! lane: `Bin(Add)` is a float add in a float body and a wrapping add in an integer one. A backend renders each node as one instruction, or a few, at the width it chooses:
//! Cranelift renders a body once for a four-lane loop and once for the scalar tail; a GPU
//! backend renders it once per thread. Nothing here knows about a target.

use std::fmt;

/// The element type of a body's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 32-bit integer.
    I32,
    /// 8-bit integer, widened to `I32` when loaded.
    I8,
    /// 8-bit unsigned integer, widened to `I32` when loaded.
    U8,
}

/// A node of a body (its index).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct E(u32);

impl fmt::Debug for E {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

/// What kind of value a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// A number of the body's lane type.
    Num,
    /// A 32-bit integer (for the float bit tricks).
    Int,
    /// A comparison result.
    Mask,
}

/// One-operand float operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Un {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// Correctly rounded square root.
    Sqrt,
    /// Round to the nearest integer, ties to even.
    Nearest,
    /// Round down.
    Floor,
    /// Round up.
    Ceil,
}

/// Two-operand float operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bin {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// The smaller; NaN if either is NaN.
    Min,
    /// The larger; NaN if either is NaN.
    Max,
}

/// Float comparisons (ordered, except `Ne` and `Unordered`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// `a == b`.
    Eq,
    /// `a != b` (true when either is NaN).
    Ne,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
    /// Either is NaN.
    Unordered,
}

/// Two-operand integer operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IBin {
    /// Wrapping `a + b`.
    Add,
    /// Wrapping `a - b`.
    Sub,
    /// Bitwise and.
    And,
    /// Bitwise or.
    Or,
}

/// A node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Node {
    /// Argument `j` of the body.
    Arg(u32),
    /// Argument `j`, a `bool` read from memory as a byte (0 or 1), as a mask: a comparison
    /// one kernel stored and another uses.
    MaskArg(u32),
    /// A number (rounded to the lane type).
    Num(f64),
    /// A 32-bit integer.
    Int(i32),
    /// A float operation on one operand.
    Un(Un, E),
    /// A float operation on two.
    Bin(Bin, E, E),
    /// `a * b + c`, fused (one rounding) where the target has FMA, else two operations.
    MulAdd(E, E, E),
    /// A comparison (a mask).
    Cmp(Cmp, E, E),
    /// A signed comparison of two 32-bit integers (a mask of the body's width): an `i32`
    /// comparison inside a float body, whose operands are the integers' bits.
    ICmp(Cmp, E, E),
    /// `t` where the mask is set, else `e`.
    Select(E, E, E),
    /// A float's bits as an integer.
    Bits(E),
    /// An integer's bits as a float.
    FromBits(E),
    /// Float to integer, truncating; the float must be integral and in range.
    ToInt(E),
    /// Integer to float.
    ToNum(E),
    /// An integer operation.
    IBin(IBin, E, E),
    /// Shift left by a constant.
    Shl(E, u8),
    /// Arithmetic shift right by a constant.
    Sshr(E, u8),
    /// Logical shift right by a constant.
    Ushr(E, u8),
    /// A number of an integer body kept to the width of `I8` or `U8` (wrapped, then extended
    /// back): what an op with an 8-bit result does to the 32-bit lane computing it.
    Wrap(E, Lane),
}

/// A kernel body: nodes in evaluation order over numbered arguments, and its results.
#[derive(Clone, Debug)]
pub struct Body {
    /// The type of its numbers.
    pub lane: Lane,
    args: u32,
    nodes: Vec<(Node, Class)>,
    /// The results, in order.
    pub results: Vec<E>,
}

impl Body {
    /// An empty body over numbers of `lane`.
    pub fn new(lane: Lane) -> Body {
        Body {
            lane,
            args: 0,
            nodes: Vec::new(),
            results: Vec::new(),
        }
    }

    /// The nodes, in evaluation order, with their classes.
    pub fn nodes(&self) -> &[(Node, Class)] {
        &self.nodes
    }

    /// How many arguments it takes.
    pub fn num_args(&self) -> usize {
        self.args as usize
    }

    /// The index of a node in [`nodes`](Body::nodes).
    pub fn index(e: E) -> usize {
        e.0 as usize
    }

    /// The class of node `e`.
    pub fn class(&self, e: E) -> Class {
        self.nodes[e.0 as usize].1
    }

    fn push(&mut self, n: Node, c: Class) -> E {
        self.nodes.push((n, c));
        E(self.nodes.len() as u32 - 1)
    }

    fn num(&mut self, n: Node, operands: &[E]) -> E {
        debug_assert!(operands.iter().all(|&e| self.class(e) == Class::Num));
        self.push(n, Class::Num)
    }

    fn int(&mut self, n: Node, operands: &[E]) -> E {
        debug_assert!(operands.iter().all(|&e| self.class(e) == Class::Int));
        self.push(n, Class::Int)
    }

    /// A new argument (numbered in order of creation).
    pub fn arg(&mut self) -> E {
        self.args += 1;
        self.push(Node::Arg(self.args - 1), Class::Num)
    }

    /// The next argument, a `bool` byte, as a mask.
    pub fn mask_arg(&mut self) -> E {
        self.args += 1;
        self.push(Node::MaskArg(self.args - 1), Class::Mask)
    }

    /// A number constant.
    pub fn c(&mut self, x: f64) -> E {
        self.push(Node::Num(x), Class::Num)
    }

    /// An integer constant.
    pub fn ic(&mut self, x: i32) -> E {
        self.push(Node::Int(x), Class::Int)
    }

    /// `op a`.
    pub fn un(&mut self, op: Un, a: E) -> E {
        self.num(Node::Un(op, a), &[a])
    }

    /// `a op b`.
    pub fn bin(&mut self, op: Bin, a: E, b: E) -> E {
        self.num(Node::Bin(op, a, b), &[a, b])
    }

    /// `a + b`.
    pub fn add(&mut self, a: E, b: E) -> E {
        self.bin(Bin::Add, a, b)
    }

    /// `a - b`.
    pub fn sub(&mut self, a: E, b: E) -> E {
        self.bin(Bin::Sub, a, b)
    }

    /// `a * b`.
    pub fn mul(&mut self, a: E, b: E) -> E {
        self.bin(Bin::Mul, a, b)
    }

    /// `a / b`.
    pub fn div(&mut self, a: E, b: E) -> E {
        self.bin(Bin::Div, a, b)
    }

    /// `a * b + c`, fused where the target has FMA.
    pub fn mul_add(&mut self, a: E, b: E, c: E) -> E {
        self.num(Node::MulAdd(a, b, c), &[a, b, c])
    }

    /// A comparison mask.
    pub fn cmp(&mut self, op: Cmp, a: E, b: E) -> E {
        debug_assert!([a, b].iter().all(|&e| self.class(e) == Class::Num));
        self.push(Node::Cmp(op, a, b), Class::Mask)
    }

    /// `a op b` on 32-bit integers, as a mask.
    pub fn icmp(&mut self, op: Cmp, a: E, b: E) -> E {
        debug_assert!([a, b].iter().all(|&e| self.class(e) == Class::Int));
        self.push(Node::ICmp(op, a, b), Class::Mask)
    }

    /// `t` where mask `m` is set, else `e`.
    pub fn select(&mut self, m: E, t: E, e: E) -> E {
        debug_assert_eq!(self.class(m), Class::Mask);
        self.num(Node::Select(m, t, e), &[t, e])
    }

    /// `t` where `a op b`, else `e`.
    pub fn select_if(&mut self, op: Cmp, a: E, b: E, t: E, e: E) -> E {
        let m = self.cmp(op, a, b);
        self.select(m, t, e)
    }

    /// `x` clamped to `[lo, hi]` by comparisons, so NaN stays NaN.
    pub fn clamp(&mut self, x: E, lo: f64, hi: f64) -> E {
        let (lo, hi) = (self.c(lo), self.c(hi));
        let x = self.select_if(Cmp::Lt, x, lo, lo, x);
        self.select_if(Cmp::Lt, hi, x, hi, x)
    }

    /// A polynomial in `x` by Horner's rule over `coeffs`, highest degree first, each step a
    /// multiply-add.
    pub fn horner(&mut self, x: E, coeffs: &[f64]) -> E {
        let mut acc = self.c(coeffs[0]);
        for &k in &coeffs[1..] {
            let k = self.c(k);
            acc = self.mul_add(acc, x, k);
        }
        acc
    }

    /// The bits of float `a` as an integer.
    pub fn bits(&mut self, a: E) -> E {
        self.push(Node::Bits(a), Class::Int)
    }

    /// Integer `a`'s bits as a float.
    pub fn from_bits(&mut self, a: E) -> E {
        self.push(Node::FromBits(a), Class::Num)
    }

    /// Integral float `a` as an integer.
    pub fn to_int(&mut self, a: E) -> E {
        self.push(Node::ToInt(a), Class::Int)
    }

    /// Integer `a` as a float.
    pub fn to_num(&mut self, a: E) -> E {
        self.push(Node::ToNum(a), Class::Num)
    }

    /// `a op b` on integers.
    pub fn ibin(&mut self, op: IBin, a: E, b: E) -> E {
        self.int(Node::IBin(op, a, b), &[a, b])
    }

    /// `a << k`.
    pub fn shl(&mut self, a: E, k: u8) -> E {
        self.int(Node::Shl(a, k), &[a])
    }

    /// `a >> k`, arithmetic.
    pub fn sshr(&mut self, a: E, k: u8) -> E {
        self.int(Node::Sshr(a, k), &[a])
    }

    /// `a >> k`, logical.
    pub fn ushr(&mut self, a: E, k: u8) -> E {
        self.int(Node::Ushr(a, k), &[a])
    }

    /// Number `a` of an integer body wrapped to `to` (`I8` or `U8`).
    pub fn wrap(&mut self, a: E, to: Lane) -> E {
        debug_assert!(self.lane == Lane::I32 && matches!(to, Lane::I8 | Lane::U8));
        self.num(Node::Wrap(a, to), &[a])
    }
}

impl fmt::Display for Body {
    /// One node per line, `eN = ...`, then the results: for reading and for tests.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        writeln!(f, "body {:?} ({} args)", self.lane, self.args)?;
        for (i, (n, _)) in self.nodes.iter().enumerate() {
            writeln!(f, "  e{i} = {n:?}")?;
        }
        let r: Vec<String> = self.results.iter().map(|e| format!("e{}", e.0)).collect();
        writeln!(f, "  results {}", r.join(", "))
    }
}
