//! [`Sql`]: a statement built with the backend's placeholders, numbered as values are bound.

use sea_orm::{Statement, Value};

use super::Dialect;

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
        self.values.push(value);
        let placeholder = self.dialect.placeholder(self.values.len());
        self.text.push_str(&placeholder);
        self
    }

    /// Append `(?, ?, …)` bound to `values`.
    pub fn bind_list(&mut self, values: impl IntoIterator<Item = Value>) -> &mut Self {
        self.text.push('(');
        for (i, value) in values.into_iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.bind(value);
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
