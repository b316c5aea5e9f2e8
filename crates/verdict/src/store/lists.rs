//! Lists bound into a statement. PostgreSQL takes each list as one array, so a statement has
//! one shape whatever the list's length and is parsed and planned once per connection, not
//! once per length; SQLite has no arrays and prepares in process, so it takes one placeholder
//! per item.

use uuid::Uuid;

/// How a backend binds a list into a statement.
pub(crate) trait Lists: sqlx::Database {
    /// Pushes a table of (tenant, bytes) keys whose columns are `column1` and `column2`,
    /// usable after `FROM` or `IN`.
    fn push_keys(q: &mut sqlx::QueryBuilder<Self>, keys: &[(Uuid, Vec<u8>)]);
    /// Pushes a condition that holds where the expression pushed before it is one of `ids`.
    fn push_in_ids(q: &mut sqlx::QueryBuilder<Self>, ids: &[Uuid]);
}

impl Lists for sqlx::Postgres {
    fn push_keys(q: &mut sqlx::QueryBuilder<Self>, keys: &[(Uuid, Vec<u8>)]) {
        q.push("(SELECT * FROM unnest(");
        q.push_bind(keys.iter().map(|(tenant, _)| *tenant).collect::<Vec<_>>());
        q.push("::uuid[], ");
        q.push_bind(keys.iter().map(|(_, key)| key.clone()).collect::<Vec<_>>());
        q.push("::bytea[]) AS k(column1, column2))");
    }

    fn push_in_ids(q: &mut sqlx::QueryBuilder<Self>, ids: &[Uuid]) {
        q.push(" = ANY(");
        q.push_bind(ids.to_vec());
        q.push("::uuid[])");
    }
}

impl Lists for sqlx::Sqlite {
    /// `(VALUES (a, b), (c, d))`.
    fn push_keys(q: &mut sqlx::QueryBuilder<Self>, keys: &[(Uuid, Vec<u8>)]) {
        q.push("(VALUES ");
        let mut list = q.separated(", ");
        for (tenant, key) in keys {
            list.push("(");
            list.push_bind_unseparated(*tenant);
            list.push_unseparated(", ");
            list.push_bind_unseparated(key.clone());
            list.push_unseparated(")");
        }
        q.push(")");
    }

    /// ` IN (a, b, c)`.
    fn push_in_ids(q: &mut sqlx::QueryBuilder<Self>, ids: &[Uuid]) {
        q.push(" IN (");
        let mut list = q.separated(", ");
        for id in ids {
            list.push_bind(*id);
        }
        q.push(")");
    }
}
