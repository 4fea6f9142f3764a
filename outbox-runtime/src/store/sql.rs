//! [`Sql`]: a statement built with the backend's placeholders, numbered as values are bound.

use sea_orm::{Statement, Value};

use super::{Dialect, clock::DbTime};

/// One item of a bound list: a value, or an instant the database computes.
#[derive(Debug, Clone)]
pub enum Arg {
    /// A bound value.
    Value(Value),
    /// An instant by the database's clock.
    Time(DbTime),
}

impl Arg {
    /// An instant, or a NULL of the type timestamps are bound as.
    pub fn time_or_null(dialect: Dialect, t: Option<DbTime>) -> Arg {
        t.map_or_else(|| Arg::Value(dialect.null_timestamp()), Arg::Time)
    }
}

impl From<Value> for Arg {
    fn from(value: Value) -> Self {
        Arg::Value(value)
    }
}

impl From<DbTime> for Arg {
    fn from(t: DbTime) -> Self {
        Arg::Time(t)
    }
}

/// Builds SQL with backend placeholders, numbering them as they are added. Every value goes in
/// as a bound parameter; only identifiers and the SDK's own constants are pushed as text.
pub struct Sql {
    pub(crate) dialect: Dialect,
    text: String,
    values: Vec<Value>,
}

impl Sql {
    /// An empty statement in `dialect`.
    pub fn new(dialect: Dialect) -> Self {
        Sql {
            dialect,
            text: String::with_capacity(256),
            values: Vec::new(),
        }
    }

    /// Append SQL text.
    pub fn push(&mut self, sql: &str) -> &mut Self {
        self.text.push_str(sql);
        self
    }

    /// Append a placeholder bound to `value`.
    pub fn bind(&mut self, value: Value) -> &mut Self {
        let placeholder = self.bind_placeholder(value);
        self.text.push_str(&placeholder);
        self
    }

    /// Append a placeholder bound to JSON text written into a JSON column.
    pub fn bind_json(&mut self, json: String) -> &mut Self {
        self.values.push(json.into());
        let placeholder = self.dialect.json_placeholder(self.values.len());
        self.text.push_str(&placeholder);
        self
    }

    /// The statement's dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Append one [`Arg`]: a placeholder bound to a value, or an instant.
    pub fn arg(&mut self, arg: Arg) -> &mut Self {
        match arg {
            Arg::Value(value) => self.bind(value),
            Arg::Time(t) => self.time(t),
        }
    }

    /// Bind `value` and return its placeholder, for an expression to append around it.
    pub(crate) fn bind_placeholder(&mut self, value: Value) -> String {
        self.values.push(value);
        self.dialect.placeholder(self.values.len())
    }

    /// Append `(?, ?, …)` bound to `items` (an instant is written as the database computes it).
    pub fn bind_list<A: Into<Arg>>(&mut self, items: impl IntoIterator<Item = A>) -> &mut Self {
        self.text.push('(');
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.arg(item.into());
        }
        self.text.push(')');
        self
    }

    /// The statement.
    pub fn build(self) -> Statement {
        self.dialect.statement(self.text, self.values)
    }
}

impl std::fmt::Debug for Sql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sql")
            .field("text", &self.text)
            .field("values", &self.values.len())
            .finish()
    }
}
