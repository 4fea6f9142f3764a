//! The part of PostgreSQL's `pgoutput` protocol (version 1, text format) the WAL relay reads:
//! Relation messages, which name a table's columns, and Insert messages, which carry a new row.
//! Begin and Commit arrive already decoded by the replication client; every other message
//! (Update, Delete, Truncate, Type, Origin) is skipped.

use std::collections::HashMap;

/// A decoding failure: the stream is not what the relay expects. The relay drops the
/// connection and starts again from the slot's confirmed position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed pgoutput message: {0}")]
pub(super) struct DecodeError(String);

/// A table as a Relation message describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Relation {
    /// Schema name.
    pub(super) namespace: String,
    /// Table name.
    pub(super) name: String,
    /// Column names, in the order tuples carry them.
    pub(super) columns: Vec<String>,
}

/// One decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Message {
    /// A table's description (sent before its first change in a session, and after it changes).
    Relation { id: u32, relation: Relation },
    /// A new row of table `relation`: each column's text, `None` for NULL.
    Insert {
        relation: u32,
        values: Vec<Option<String>>,
    },
    /// Anything else.
    Other,
}

/// Read one message.
pub(super) fn decode(data: &[u8]) -> Result<Message, DecodeError> {
    let mut r = Reader { data, at: 0 };
    match r.u8()? {
        b'R' => {
            let id = r.u32()?;
            let namespace = r.cstr()?;
            let name = r.cstr()?;
            let _replica_identity = r.u8()?;
            let count = r.u16()?;
            let mut columns = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let _flags = r.u8()?;
                columns.push(r.cstr()?);
                let _type_oid = r.u32()?;
                let _type_modifier = r.u32()?;
            }
            Ok(Message::Relation {
                id,
                relation: Relation {
                    namespace,
                    name,
                    columns,
                },
            })
        }
        b'I' => {
            let relation = r.u32()?;
            if r.u8()? != b'N' {
                return Err(DecodeError("an Insert without a new tuple".into()));
            }
            let count = r.u16()?;
            let mut values = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                match r.u8()? {
                    b'n' => values.push(None),
                    b't' => {
                        let len = r.u32()? as usize;
                        let bytes = r.take(len)?;
                        let text = std::str::from_utf8(bytes)
                            .map_err(|_| DecodeError("a column value is not UTF-8".into()))?;
                        values.push(Some(text.to_owned()));
                    }
                    // An unchanged TOASTed value cannot occur in an Insert; binary values only
                    // when asked for, which the relay does not.
                    other => {
                        return Err(DecodeError(format!(
                            "unexpected column kind {:?} in an Insert",
                            other as char
                        )));
                    }
                }
            }
            Ok(Message::Insert { relation, values })
        }
        _ => Ok(Message::Other),
    }
}

/// The relations seen on a stream, by id.
pub(super) type Relations = HashMap<u32, Relation>;

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.data.len())
            .ok_or_else(|| DecodeError("message ends early".into()))?;
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn cstr(&mut self) -> Result<String, DecodeError> {
        let rest = &self.data[self.at..];
        let end = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| DecodeError("unterminated string".into()))?;
        let text = std::str::from_utf8(&rest[..end])
            .map_err(|_| DecodeError("a name is not UTF-8".into()))?
            .to_owned();
        self.at += end + 1;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation_message() -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(16_384u32.to_be_bytes());
        m.extend(b"public\0outbox_event\0");
        m.push(b'd');
        m.extend(2u16.to_be_bytes());
        for name in ["id", "payload"] {
            m.push(1);
            m.extend(name.as_bytes());
            m.push(0);
            m.extend(20u32.to_be_bytes());
            m.extend(u32::MAX.to_be_bytes());
        }
        m
    }

    #[test]
    fn reads_a_relation_and_an_insert() {
        assert_eq!(
            decode(&relation_message()).unwrap(),
            Message::Relation {
                id: 16_384,
                relation: Relation {
                    namespace: "public".into(),
                    name: "outbox_event".into(),
                    columns: vec!["id".into(), "payload".into()],
                },
            }
        );
        let mut insert = vec![b'I'];
        insert.extend(16_384u32.to_be_bytes());
        insert.push(b'N');
        insert.extend(2u16.to_be_bytes());
        insert.push(b't');
        insert.extend(2u32.to_be_bytes());
        insert.extend(b"42");
        insert.push(b'n');
        assert_eq!(
            decode(&insert).unwrap(),
            Message::Insert {
                relation: 16_384,
                values: vec![Some("42".into()), None],
            }
        );
    }

    #[test]
    fn refuses_a_truncated_message() {
        let mut m = relation_message();
        m.truncate(m.len() - 3);
        assert!(decode(&m).is_err());
        assert_eq!(decode(b"U\0").unwrap(), Message::Other);
        assert!(decode(b"").is_err());
    }
}
