//! Compiling a condition: parsing within the nesting and depth bounds, and the load-time
//! checks (variables, functions, comprehensions) that make an evaluation's cost bounded.

use cel::{
    Program,
    common::ast::{EntryExpr, Expr, IdedExpr, MapExpr, StructExpr},
};

use super::*;

impl Condition {
    /// Compiles and checks `source`.
    pub fn compile(source: &str) -> Result<Self, CompileError> {
        if source.len() > MAX_EXPRESSION_BYTES {
            return Err(CompileError::TooLong(source.len()));
        }
        if source.trim().is_empty() {
            return Err(CompileError::Empty);
        }
        let program = parse(source)?;
        let mut check = Check {
            program: &program,
            bound: Vec::new(),
            reads: Vec::new(),
            loops: false,
            args_reads: 0,
            over_args: 0,
            superlinear: false,
        };
        check.walk(program.expression(), 0)?;
        let mut reads = check.reads;
        reads.sort_unstable();
        reads.dedup();
        let metered = meter::rewrite(program.expression());
        Ok(Condition {
            source: source.into(),
            direct: direct::Direct::plan(&metered),
            loops: check.loops,
            superlinear: check.superlinear,
            metered,
            reads,
        })
    }
}

/// The stack a deep expression is parsed on. The parser recurses several rule functions deep
/// per nesting level: ~200 KiB a level in an unoptimised build (the fuzz targets, the tests),
/// ~8 KiB in an optimised one, so [`MAX_NESTING`] needs ~6 MiB at worst, more than the 2 MiB
/// of the Tokio blocking thread a reload compiles on. Pages it does not touch are never
/// resident.
const PARSE_STACK_BYTES: usize = 16 << 20;

/// Each nesting level opens with one of these, so an expression with `n` of them nests at
/// most `n + 1` deep.
const OPENERS: &[u8] = b"([{?";

/// Below this many openers an expression is parsed on the calling thread: at most 4 levels,
/// ~1.3 MiB unoptimised. A thread of its own made a parse 0.42 ms instead of 0.20 (unoptimised),
/// which nearly every real condition does without.
pub(super) const SHALLOW_OPENERS: usize = 4;

/// Parses `source`, refusing nesting beyond [`MAX_NESTING`] and trees deeper than
/// [`MAX_DEPTH`] before anything else walks them; an expression that may nest deeply, on a
/// thread of its own (see [`PARSE_STACK_BYTES`]). A chain of operators without nesting costs
/// the parser (and dropping its tree) far less a level: the longest the length limit allows
/// is refused in the unit tests on a 2 MiB stack, unoptimised.
fn parse(source: &str) -> Result<Program, CompileError> {
    let openers = source.bytes().filter(|b| OPENERS.contains(b)).count();
    if openers < SHALLOW_OPENERS {
        return parse_here(source, openers);
    }
    std::thread::scope(|scope| {
        let parser = std::thread::Builder::new()
            .name("toolgate-cel-parse".to_owned())
            .stack_size(PARSE_STACK_BYTES)
            .spawn_scoped(scope, || parse_here(source, openers))
            .map_err(|err| CompileError::Parser(format!("cannot start its thread: {err}")))?;
        // The parser is third-party code fed the catalog: a panic in it refuses the expression.
        parser
            .join()
            .unwrap_or_else(|_| Err(CompileError::Parser("it failed".to_owned())))
    })
}

fn parse_here(source: &str, openers: usize) -> Result<Program, CompileError> {
    // The parser's own recursion limit counts `expr` rules entered beyond the limit given
    // plus one: the whole expression is one, each level of nesting one more. Parsing once
    // with it bounds the recursion of the parse that builds the program (`Env::compile`
    // takes no limit); an expression with fewer openers cannot be too deep.
    if openers >= MAX_NESTING
        && let Err(errors) = env()
            .parser()
            .max_recursion_depth(MAX_NESTING as u16)
            .parse(source)
    {
        let nested = errors
            .errors
            .iter()
            .any(|error| error.msg.contains("Recursion limit"));
        return Err(if nested {
            CompileError::TooNested
        } else {
            CompileError::Syntax(syntax_message(&errors))
        });
    }
    let program = env()
        .compile(source)
        .map_err(|errors| CompileError::Syntax(syntax_message(&errors)))?;
    if let Some(too_deep) = deeper_than(program.expression(), MAX_DEPTH) {
        return Err(CompileError::TreeTooDeep {
            position: position(&program, too_deep),
        });
    }
    Ok(program)
}

/// The first node found below `limit` levels, if any: measured with a stack of its own, not
/// by recursion, since the tree is not yet known to be shallow.
fn deeper_than(root: &IdedExpr, limit: usize) -> Option<&IdedExpr> {
    let mut pending = vec![(root, 1)];
    while let Some((expr, depth)) = pending.pop() {
        if depth > limit {
            return Some(expr);
        }
        let below = depth + 1;
        match &expr.expr {
            Expr::Unspecified | Expr::Literal(_) | Expr::Ident(_) => {}
            Expr::Select(select) => pending.push((&select.operand, below)),
            Expr::Call(call) => {
                pending.extend(call.target.iter().map(|target| (&**target, below)));
                pending.extend(call.args.iter().map(|arg| (arg, below)));
            }
            Expr::List(list) => pending.extend(list.elements.iter().map(|e| (e, below))),
            Expr::Map(MapExpr { entries }) | Expr::Struct(StructExpr { entries, .. }) => {
                for entry in entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(entry) => {
                            pending.extend([(&entry.key, below), (&entry.value, below)])
                        }
                        EntryExpr::StructField(field) => pending.push((&field.value, below)),
                    }
                }
            }
            Expr::Comprehension(loop_) => pending.extend(
                [
                    &loop_.iter_range,
                    &loop_.accu_init,
                    &loop_.loop_cond,
                    &loop_.loop_step,
                    &loop_.result,
                ]
                .map(|e| (e, below)),
            ),
        }
    }
    None
}

/// Where `expr` is written in the program's source, as a line and a column in characters,
/// both from 1 (the parser records the byte offsets where each node starts and stops).
fn position(program: &Program, expr: &IdedExpr) -> String {
    let info = program.source_info();
    let before = info
        .offset_for(expr.id)
        .and_then(|(start, _)| info.source.get(..start as usize));
    let Some(before) = before else {
        return "an unknown position".to_owned();
    };
    let (mut line, mut column) = (1, 1);
    for c in before.chars() {
        if c == '\n' {
            (line, column) = (line + 1, 1);
        } else {
            column += 1;
        }
    }
    format!("line {line}, column {column}")
}

/// The first syntax error, with its line and column (the parser's, both already from 1).
fn syntax_message(errors: &cel::ParseErrors) -> String {
    match errors.errors.first() {
        Some(error) => format!(
            "syntax error at line {}, column {}: {}",
            error.pos.0, error.pos.1, error.msg
        ),
        None => "syntax error".to_owned(),
    }
}

/// The load-time checks, walking the expression once.
struct Check<'p> {
    program: &'p Program,
    /// Comprehension variables in scope.
    bound: Vec<String>,
    /// Indices into [`VARIABLES`] of the variables read.
    reads: Vec<usize>,
    /// Whether it has a comprehension.
    loops: bool,
    /// Reads of `args` so far (to tell whether a comprehension's range reads it).
    args_reads: usize,
    /// Comprehensions over the arguments the walk is in the body of.
    over_args: usize,
    /// Whether a body of such a comprehension reads the arguments.
    superlinear: bool,
}

impl Check<'_> {
    fn position(&self, expr: &IdedExpr) -> String {
        position(self.program, expr)
    }

    fn walk(&mut self, expr: &IdedExpr, loops: usize) -> Result<(), CompileError> {
        match &expr.expr {
            Expr::Unspecified | Expr::Literal(_) => Ok(()),
            Expr::Ident(name) => {
                if self.bound.iter().any(|b| b == name) || TYPE_NAMES.contains(&name.as_str()) {
                    return Ok(());
                }
                let Some(index) = VARIABLES.iter().position(|v| v == name) else {
                    return Err(CompileError::UnknownVariable {
                        name: name.clone(),
                        position: self.position(expr),
                    });
                };
                self.reads.push(index);
                if name == "args" {
                    self.args_reads += 1;
                    self.superlinear |= self.over_args > 0;
                }
                Ok(())
            }
            Expr::Select(select) => self.walk(&select.operand, loops),
            Expr::Call(call) => {
                let name = call.func_name.as_str();
                let operator = name.starts_with(['_', '@', '!', '-']);
                if !operator && !FUNCTIONS.contains(&name) {
                    return Err(CompileError::UnknownFunction {
                        name: name.to_owned(),
                        position: self.position(expr),
                    });
                }
                if let Some(target) = &call.target {
                    self.walk(target, loops)?;
                }
                call.args.iter().try_for_each(|arg| self.walk(arg, loops))
            }
            Expr::List(list) => list.elements.iter().try_for_each(|e| self.walk(e, loops)),
            Expr::Map(map) => map.entries.iter().try_for_each(|entry| match &entry.expr {
                EntryExpr::MapEntry(entry) => {
                    self.walk(&entry.key, loops)?;
                    self.walk(&entry.value, loops)
                }
                EntryExpr::StructField(field) => self.walk(&field.value, loops),
            }),
            Expr::Struct(message) => Err(CompileError::Struct {
                name: message.type_name.clone(),
                position: self.position(expr),
            }),
            Expr::Comprehension(comprehension) => {
                self.loops = true;
                if loops >= MAX_NESTED_LOOPS {
                    return Err(CompileError::TooDeep {
                        position: self.position(expr),
                    });
                }
                // The range is outside the loop's scope; the rest sees its variables.
                let args_before = self.args_reads;
                self.walk(&comprehension.iter_range, loops)?;
                let over_args = usize::from(self.args_reads > args_before);
                self.walk(&comprehension.accu_init, loops)?;
                let scope = self.bound.len();
                self.bound.push(comprehension.iter_var.clone());
                self.bound.extend(comprehension.iter_var2.clone());
                self.bound.push(comprehension.accu_var.clone());
                // What each iteration evaluates; the result, once after the loop.
                self.over_args += over_args;
                let body = [&comprehension.loop_cond, &comprehension.loop_step];
                let walked = body.into_iter().try_for_each(|e| self.walk(e, loops + 1));
                self.over_args -= over_args;
                let walked = walked.and_then(|()| self.walk(&comprehension.result, loops + 1));
                self.bound.truncate(scope);
                walked
            }
        }
    }
}
