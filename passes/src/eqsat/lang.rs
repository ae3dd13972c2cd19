//! The e-graph's language and analysis: tcc's ops as e-nodes, every e-class typed by tcc-ir's
//! own type rules.
//!
//! An op becomes `Op(tag, operands ++ [attrs])`: the tag is its [`OpId`] (its mnemonic), the
//! children are its operands' e-classes and, for ops with attributes, one last child: an
//! [`Node::Attr`] leaf naming the op's whole [`OpKind`] (interned in [`Tables`]). Patterns read
//! like the IR: `(add ?a ?b)`, `(transpose ?x ?perm)`; a rule that needs an attribute's value
//! reads it from the leaf ([`attrs_of`]). Parameters and constants are leaves; a constant is
//! interned by content (small ones and splats) or by the value that defined it (large weights,
//! never copied). Ops the engine must not touch become `Op(opaque{i}, operands)`: no rule names
//! them, so they and their operands stay as they are.
//!
//! [`TensorAnalysis`] gives each e-class its [`TensorType`] by calling
//! [`tcc_ir::typing::infer`] on the e-node that made it (one source of truth, no second type
//! checker), and folds constants through the reference interpreter as `canonicalize` does. Two
//! e-classes of different types being merged is a bug in the rule that did it: the analysis
//! records the rule's name and the runner stops (the pass then fails, leaving the function as it
//! was).

use egg::Language;
use egg::{Analysis, DidMerge, EGraph, Id, Symbol};
use indexmap::IndexSet;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;
use tcc_ir::interp::ConstArg;
use tcc_ir::ops::OpId;
use tcc_ir::{Function, Literal, Op, OpKind, TensorType, Value};

macro_rules! leaf_ref {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl FromStr for $name {
            type Err = ();
            fn from_str(s: &str) -> Result<Self, ()> {
                let n = s.strip_prefix($prefix).ok_or(())?;
                n.parse().map($name).map_err(|_| ())
            }
        }
    };
}

leaf_ref!(
    /// A function parameter, by position.
    ParamRef,
    "#param"
);
leaf_ref!(
    /// A constant, by its index in [`Tables::consts`].
    ConstRef,
    "#const"
);
leaf_ref!(
    /// An op's attributes, by the index of its [`OpKind`] in [`Tables::kinds`].
    AttrRef,
    "#attrs"
);

/// What an [`Node::Op`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tag {
    /// The op of that name; its attributes, if it has any, are its last child.
    Op(OpId),
    /// One result of an op the engine leaves alone, by its index in [`Tables::opaque`].
    Opaque(u32),
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tag::Op(id) => f.write_str(id.mnemonic()),
            Tag::Opaque(i) => write!(f, "opaque{i}"),
        }
    }
}

impl FromStr for Tag {
    type Err = ();
    fn from_str(s: &str) -> Result<Tag, ()> {
        if let Some(i) = s.strip_prefix("opaque") {
            return i.parse().map(Tag::Opaque).map_err(|_| ());
        }
        match OpId::from_mnemonic(s) {
            Some(OpId::Const) | None => Err(()),
            Some(id) => Ok(Tag::Op(id)),
        }
    }
}

pub use node::Node;

mod node {
    // The variants are documented on the enum: the macro takes no doc comments on them.
    #![allow(missing_docs)]
    use super::{AttrRef, ConstRef, ParamRef, Tag};
    use egg::{Id, define_language};

    define_language! {
        /// An e-node: a parameter (`#param0`), a constant (`#const3`), the attributes of the op
        /// whose last child it is (`#attrs5`), or an op applied to e-classes (`add`,
        /// `opaque2`).
        pub enum Node {
            Param(ParamRef),
            Const(ConstRef),
            Attr(AttrRef),
            Op(Tag, Vec<Id>),
        }
    }
}

/// Whether ops with this id carry attributes (and so an attribute child).
pub fn has_attrs(id: OpId) -> bool {
    static TABLE: OnceLock<Vec<bool>> = OnceLock::new();
    TABLE.get_or_init(|| OpId::ALL.iter().map(|id| !id.attrs().is_empty()).collect())[id as usize]
}

/// A constant the e-graph knows.
#[derive(Clone, Debug)]
pub struct ConstEntry {
    /// Its type.
    pub ty: TensorType,
    /// Its elements, when it is a splat or small enough to fold with.
    pub value: Option<Literal>,
    /// The value that defined it in the function, when it came from there.
    pub origin: Option<Value>,
}

impl ConstEntry {
    /// Its elements: held, or those of the constant op in `f` that defined it.
    pub fn literal<'a>(&'a self, f: &'a Function) -> Option<&'a Literal> {
        match (&self.value, self.origin) {
            (Some(v), _) => Some(v),
            (None, Some(o)) => match &f.op(f.def_op(o)?).kind {
                OpKind::Const { value, .. } => Some(value),
                _ => None,
            },
            (None, None) => None,
        }
    }
}

/// One result of an op the engine does not rewrite.
#[derive(Clone, Debug)]
pub struct OpaqueEntry {
    /// The op in the function.
    pub op: Op,
    /// Which of its results.
    pub result: usize,
    /// What the op computes (for the time model).
    pub kind: OpKind,
    /// That result's type.
    pub ty: TensorType,
}

/// What the e-graph's leaves and attribute nodes refer to.
#[derive(Clone, Debug, Default)]
pub struct Tables {
    /// Parameter types, by position.
    pub params: Vec<TensorType>,
    /// Constants.
    pub consts: Vec<ConstEntry>,
    /// Interned attributes.
    pub kinds: IndexSet<OpKind>,
    /// Results of opaque ops.
    pub opaque: Vec<OpaqueEntry>,
    small_consts: HashMap<(TensorType, Literal), u32>,
    origin_consts: HashMap<Value, u32>,
}

impl Tables {
    /// Empty tables for a function with parameters of these types.
    pub fn new(params: Vec<TensorType>) -> Tables {
        Tables {
            params,
            ..Tables::default()
        }
    }

    /// The leaf for a constant of type `ty`: interned by content when `value` is given (a splat,
    /// or small), by `origin` otherwise.
    pub fn intern_const(
        &mut self,
        ty: &TensorType,
        value: Option<Literal>,
        origin: Option<Value>,
    ) -> ConstRef {
        let next = self.consts.len() as u32;
        let i = match (&value, origin) {
            (Some(v), _) => *self
                .small_consts
                .entry((ty.clone(), v.clone()))
                .or_insert(next),
            (None, Some(o)) => *self.origin_consts.entry(o).or_insert(next),
            (None, None) => next,
        };
        if i == next {
            self.consts.push(ConstEntry {
                ty: ty.clone(),
                value,
                origin,
            });
        }
        ConstRef(i)
    }

    /// The attribute leaf for `kind`.
    pub fn intern_kind(&mut self, kind: OpKind) -> AttrRef {
        AttrRef(self.kinds.insert_full(kind).0 as u32)
    }
}

/// The analysis data of an e-class.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassData {
    /// The type of the values in the class; `None` for an attribute leaf.
    pub ty: Option<TensorType>,
    /// The class is this constant (a splat or small).
    pub konst: Option<ConstRef>,
    /// The class is known at compile time: a constant, or an op on such classes only (a
    /// merged weight), which the pass folds when it writes the program back.
    pub constant: bool,
}

/// Types every e-class and folds constants; see the module docs.
#[derive(Debug, Default)]
pub struct TensorAnalysis {
    /// The leaves' tables.
    pub tables: Tables,
    /// Largest dense constant folding may create, in elements.
    pub fold_limit: u64,
    /// The rule being applied, for error messages.
    pub rule: Option<Symbol>,
    /// The first internal error (an ill-typed node, a type-changing merge).
    pub error: Option<String>,
}

impl TensorAnalysis {
    fn fail(&mut self, what: String) {
        if self.error.is_none() {
            let by = match self.rule {
                Some(r) => format!("rule `{r}`"),
                None => "encoding the function".to_string(),
            };
            self.error = Some(format!("internal error in eqsat ({by}): {what}"));
        }
    }
}

/// The op an `Op(Tag::Op(id), children)` node computes: its interned attributes, or the op
/// itself when it has none.
pub fn kind_of(egraph: &EGraph<Node, TensorAnalysis>, id: OpId, children: &[Id]) -> OpKind {
    if !has_attrs(id) {
        return id.blank(&TensorType::scalar(tcc_ir::DType::F32));
    }
    // Attribute classes are never merged with anything: each holds its leaf.
    attrs_of(egraph, *children.last().expect("an attribute child"))
        .expect("an attribute class holds its leaf")
        .clone()
}

/// The attributes held by an attribute e-class.
pub fn attrs_of(egraph: &EGraph<Node, TensorAnalysis>, class: Id) -> Option<&OpKind> {
    egraph[class].nodes.iter().find_map(|n| match n {
        Node::Attr(a) => egraph.analysis.tables.kinds.get_index(a.0 as usize),
        _ => None,
    })
}

/// The operands of an op node (its children without the attribute child).
pub fn operands(node: &Node) -> &[Id] {
    match node {
        Node::Op(Tag::Op(id), ch) if has_attrs(*id) => &ch[..ch.len() - 1],
        _ => node.children(),
    }
}

impl Analysis<Node> for TensorAnalysis {
    type Data = ClassData;

    fn make(egraph: &mut EGraph<Node, Self>, enode: &Node, _id: Id) -> ClassData {
        let t = &egraph.analysis.tables;
        let tensor = |ty: &TensorType| ClassData {
            ty: Some(ty.clone()),
            konst: None,
            constant: false,
        };
        match enode {
            Node::Attr(_) => ClassData {
                ty: None,
                konst: None,
                constant: false,
            },
            Node::Param(p) => tensor(&t.params[p.0 as usize]),
            Node::Const(c) => {
                let e = &t.consts[c.0 as usize];
                ClassData {
                    ty: Some(e.ty.clone()),
                    konst: e.value.is_some().then_some(*c),
                    constant: true,
                }
            }
            Node::Op(Tag::Opaque(i), _) => tensor(&t.opaque[*i as usize].ty),
            Node::Op(Tag::Op(id), children) => {
                let kind = kind_of(egraph, *id, children);
                let args = operands(enode);
                let tys: Option<Vec<&TensorType>> =
                    args.iter().map(|&a| egraph[a].data.ty.as_ref()).collect();
                let ty = match tys.map(|tys| tcc_ir::typing::infer(&kind, &tys)) {
                    Some(Ok(mut r)) if r.len() == 1 => r.pop(),
                    Some(Ok(_)) => None,
                    Some(Err(e)) => {
                        let msg = format!("`{}` is ill-typed: {e}", kind.mnemonic());
                        egraph.analysis.fail(msg);
                        None
                    }
                    None => {
                        let msg = format!("`{}` has an attribute as an operand", kind.mnemonic());
                        egraph.analysis.fail(msg);
                        None
                    }
                };
                let konst = ty.as_ref().and_then(|ty| fold(egraph, &kind, args, ty));
                let constant = args.iter().all(|&a| egraph[a].data.constant);
                ClassData {
                    ty,
                    konst,
                    constant,
                }
            }
        }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        if a.ty != b.ty {
            let show = |t: &Option<TensorType>| {
                t.as_ref().map_or("an attribute".into(), |t| t.to_string())
            };
            self.fail(format!(
                "it made a value of type {} equal to one of type {}",
                show(&a.ty),
                show(&b.ty)
            ));
            return DidMerge(false, false);
        }
        let konst = match (a.konst, b.konst) {
            (None, Some(k)) => {
                a.konst = Some(k);
                DidMerge(true, false)
            }
            (Some(_), None) => DidMerge(false, true),
            _ => DidMerge(false, false),
        };
        let constant = DidMerge(!a.constant && b.constant, a.constant && !b.constant);
        a.constant |= b.constant;
        konst | constant
    }

    fn modify(egraph: &mut EGraph<Node, Self>, id: Id) {
        if let Some(k) = egraph[id].data.konst
            && !egraph[id].nodes.iter().any(|n| matches!(n, Node::Const(_)))
        {
            let c = egraph.add(Node::Const(k));
            egraph.union(id, c);
        }
    }
}

/// The constant an op computes from constant operands, if it folds (as `canonicalize` folds).
fn fold(
    egraph: &mut EGraph<Node, TensorAnalysis>,
    kind: &OpKind,
    args: &[Id],
    ty: &TensorType,
) -> Option<ConstRef> {
    let t = &egraph.analysis.tables;
    let consts: Option<Vec<&ConstEntry>> = args
        .iter()
        .map(|&a| egraph[a].data.konst.map(|k| &t.consts[k.0 as usize]))
        .collect();
    let consts = consts?;
    let cargs: Option<Vec<ConstArg<'_>>> = consts
        .iter()
        .map(|e| {
            Some(ConstArg {
                ty: &e.ty,
                value: e.value.as_ref()?,
            })
        })
        .collect();
    let lit = crate::canonicalize::fold::fold(kind, &cargs?, ty, egraph.analysis.fold_limit)?;
    Some(egraph.analysis.tables.intern_const(ty, Some(lit), None))
}
