//! Statements whose parameters are numbered as their text is rendered: each input is a list
//! of rows (one array parameter per column, from the row type's own column list) or one
//! value, named in the statement's template as `{name}` (its `unnest(…) AS name(…)`, or its
//! `$N`) and `{name.columns}` (its row type's column names). The text and the binds come
//! from the same list of inputs, in the same order, so no `$N` is numbered by hand and no
//! bind can land on another column.

use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

use crate::store::rows::{Col, Row};

/// A statement with its arguments still being bound.
pub(super) type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// One input of a statement.
pub(super) trait Param {
    /// Its name in the template.
    fn name(&self) -> &'static str;
    /// Its SQL, taking parameter numbers from `next` on.
    fn sql(&self, next: &mut usize) -> String;
    /// The column names of its rows (empty for a single value).
    fn columns(&self) -> String;
    /// Binds its values, in the order [`Param::sql`] numbered them.
    fn bind<'q>(&self, query: PgQuery<'q>) -> PgQuery<'q>;
}

/// Rows taken as one array per column, optionally preceded by an `i` column (the position
/// the statement reports each row under).
pub(super) struct Rows<'a, R> {
    name: &'static str,
    index: Option<Vec<i32>>,
    rows: Vec<&'a R>,
}

impl<'a, R: Row> Rows<'a, R> {
    /// `rows`, known in the template as `name`.
    pub(super) fn new(name: &'static str, rows: Vec<&'a R>) -> Self {
        Self {
            name,
            index: None,
            rows,
        }
    }

    /// `rows` with an `i` column first holding `index`.
    pub(super) fn indexed(name: &'static str, index: Vec<i32>, rows: Vec<&'a R>) -> Self {
        Self {
            name,
            index: Some(index),
            rows,
        }
    }
}

impl<R: Row> Param for Rows<'_, R> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn sql(&self, next: &mut usize) -> String {
        let columns = R::columns();
        let mut arrays = Vec::new();
        let mut names = Vec::new();
        if self.index.is_some() {
            arrays.push(numbered(next, "int4[]"));
            names.push("i");
        }
        for column in &columns {
            arrays.push(numbered(next, &format!("{}[]", column.pg_type())));
            names.push(column.name());
        }
        format!(
            "unnest({}) AS {}({})",
            arrays.join(", "),
            self.name,
            names.join(", ")
        )
    }

    fn columns(&self) -> String {
        R::column_list()
    }

    fn bind<'q>(&self, mut query: PgQuery<'q>) -> PgQuery<'q> {
        if let Some(index) = &self.index {
            query = query.bind(index.clone());
        }
        for column in R::columns() {
            query = bind_column(query, &column, &self.rows);
        }
        query
    }
}

/// One `int8` value.
pub(super) struct Int8(pub &'static str, pub i64);

impl Param for Int8 {
    fn name(&self) -> &'static str {
        self.0
    }

    fn sql(&self, next: &mut usize) -> String {
        numbered(next, "int8")
    }

    fn columns(&self) -> String {
        String::new()
    }

    fn bind<'q>(&self, query: PgQuery<'q>) -> PgQuery<'q> {
        query.bind(self.1)
    }
}

/// The next parameter, cast to `pg_type`.
fn numbered(next: &mut usize, pg_type: &str) -> String {
    *next += 1;
    format!("${}::{pg_type}", *next)
}

/// Binds one column of `rows` as an array.
fn bind_column<'q, R>(query: PgQuery<'q>, column: &Col<R>, rows: &[&R]) -> PgQuery<'q> {
    fn array<R, T>(rows: &[&R], value: impl Fn(&R) -> T) -> Vec<T> {
        rows.iter().map(|r| value(r)).collect()
    }
    match column {
        Col::Uuid(_, f) => query.bind(array(rows, f)),
        Col::OptUuid(_, f) => query.bind(array(rows, f)),
        Col::Int8(_, f) => query.bind(array(rows, f)),
        Col::Int4(_, f) => query.bind(array(rows, f)),
        Col::Bool(_, f) => query.bind(array(rows, f)),
        Col::OptInt4(_, f) => query.bind(array(rows, f)),
        Col::Str(_, f) => query.bind(array(rows, f)),
        Col::OptStr(_, f) => query.bind(array(rows, f)),
        Col::Text(_, f) => query.bind(array(rows, f)),
        Col::OptText(_, f) => query.bind(array(rows, f)),
        Col::Bytes(_, f) => query.bind(array(rows, f)),
        Col::OptBytes(_, f) => query.bind(array(rows, f)),
        Col::Wants(action, f) => query.bind(array(rows, |r| f(r, *action))),
    }
}

/// `template` with each input's placeholders replaced, numbering parameters in `inputs`'
/// order.
///
/// # Panics
/// If the template names an input that is not given, or leaves one given unused: both are
/// mistakes in the statement's text, which the tests render.
pub(super) fn render(template: &str, inputs: &[&dyn Param]) -> String {
    let mut next = 0;
    let mut text = template.to_owned();
    for input in inputs {
        let placeholder = format!("{{{}}}", input.name());
        assert!(
            text.contains(&placeholder),
            "the statement does not use {placeholder}"
        );
        text = text.replacen(&placeholder, &input.sql(&mut next), 1);
        assert!(
            !text.contains(&placeholder),
            "the statement uses {placeholder} twice"
        );
        text = text.replace(&format!("{{{}.columns}}", input.name()), &input.columns());
    }
    assert!(
        !text.contains('{'),
        "the statement names an input it is not given: {text}"
    );
    text
}

/// `query` with every input's values bound, in [`render`]'s order.
pub(super) fn bind_all<'q>(mut query: PgQuery<'q>, inputs: &[&dyn Param]) -> PgQuery<'q> {
    for input in inputs {
        query = input.bind(query);
    }
    query
}
