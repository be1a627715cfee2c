//! Newline framing with a bound: a line is read into a buffer that never holds more
//! than the limit, so a server that writes an endless line cannot grow our memory.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::transport::error::TransportError;

/// Reads one line into `line` (without the newline). `Ok(false)` at EOF with nothing
/// read. A line longer than `max` is an error, and no more than `max` bytes are held.
pub(super) async fn read_line_bounded<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
    max: usize,
) -> Result<bool, TransportError> {
    line.clear();
    loop {
        let available = reader
            .fill_buf()
            .await
            .map_err(|e| TransportError::Closed {
                exit: None,
                detail: Some(format!("read failed: {e}")),
            })?;
        if available.is_empty() {
            // EOF: a partial last line is not a message.
            return Ok(false);
        }
        match available.iter().position(|b| *b == b'\n') {
            Some(n) => {
                if line.len() + n > max {
                    return Err(TransportError::LineTooLong { limit: max });
                }
                line.extend_from_slice(&available[..n]);
                reader.consume(n + 1);
                return Ok(true);
            }
            None => {
                let n = available.len();
                if line.len() + n > max {
                    return Err(TransportError::LineTooLong { limit: max });
                }
                line.extend_from_slice(available);
                reader.consume(n);
            }
        }
    }
}

/// Discards the rest of a line without holding it; false at EOF or on an error.
pub(super) async fn skip_line<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) -> bool {
    loop {
        let Ok(available) = reader.fill_buf().await else {
            return false;
        };
        if available.is_empty() {
            return false;
        }
        match available.iter().position(|b| *b == b'\n') {
            Some(n) => {
                reader.consume(n + 1);
                return true;
            }
            None => {
                let n = available.len();
                reader.consume(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_reader_splits_lines_and_rejects_long_ones() {
        let data: &[u8] = b"{\"a\":1}\n\nabcdefghij\nxyz";
        let mut r = BufReader::with_capacity(4, data);
        let mut line = Vec::new();
        assert_eq!(read_line_bounded(&mut r, &mut line, 8).await, Ok(true));
        assert_eq!(line, b"{\"a\":1}");
        assert_eq!(read_line_bounded(&mut r, &mut line, 8).await, Ok(true));
        assert!(line.is_empty());
        assert_eq!(
            read_line_bounded(&mut r, &mut line, 8).await,
            Err(TransportError::LineTooLong { limit: 8 })
        );
        assert!(line.len() <= 8, "never holds more than the limit");
    }

    #[tokio::test]
    async fn a_partial_line_at_eof_is_not_a_message() {
        let data: &[u8] = b"{\"jsonrpc\":";
        let mut r = BufReader::new(data);
        let mut line = Vec::new();
        assert_eq!(read_line_bounded(&mut r, &mut line, 1024).await, Ok(false));
    }
}
