//! [`Sql`]: a statement built with the backend's placeholders, numbered as values are bound, with
//! instants written as the database computes them ([`Sql::time`]); and [`database_now`], the
//! database's current time.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbErr, Statement, Value};

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

    /// Append the instant `t` as the database computes it: its clock's current time, plus the
    /// offset as a bound value when there is one.
    pub fn time(&mut self, t: DbTime) -> &mut Self {
        let offset = t.offset_micros();
        if offset == 0 {
            let now = self.dialect.time_expression(None);
            self.push(&now)
        } else {
            let placeholder = self.bind_placeholder(offset.into());
            let shifted = self.dialect.time_expression(Some(&placeholder));
            self.push(&shifted)
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

/// The database's current time (one round trip): what the admin API and the metrics measure
/// ages against, and where retention's cutoffs are counted back from.
pub async fn database_now<C: ConnectionTrait + ?Sized>(conn: &C) -> Result<DateTime<Utc>, DbErr> {
    let dialect = Dialect::of(conn);
    let mut sql = Sql::new(dialect);
    sql.push("SELECT ").time(DbTime::NOW).push(" AS now");
    let row = conn
        .query_one_raw(sql.build())
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("the database's current time".to_owned()))?;
    dialect.get_timestamp(&row, "now")
}

impl std::fmt::Debug for Sql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sql")
            .field("text", &self.text)
            .field("values", &self.values.len())
            .finish()
    }
}
