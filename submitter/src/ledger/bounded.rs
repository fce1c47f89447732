//! A client-side time bound on every PostgreSQL call (issue 32 item 9; docs/ledger.md "Bounds").
//!
//! `connect_timeout` covers the TCP connect only and `statement_timeout` is the server's: a
//! connection that stalls after connecting (a hung pooler, a half-open path, a proxy that stops
//! forwarding) never answers either. So the calls run on `tokio-postgres` here, on a runtime of
//! the client's own (one thread, the caller's: nothing async leaks out), and each call races its
//! deadline. At the deadline the connection's task is aborted: dropping it closes the socket and
//! the response channels every pending call waits on, so the call ends at once with the driver's
//! "connection closed" (an error the callers already read), and the next call reconnects. No
//! socket has to be found and nothing depends on what else the process has open.
//!
//! The surface is what the ledger and the team code use: typed statements, batches,
//! transactions (read-only too) and binary `COPY … FROM STDIN`.

use std::cell::Cell;
use std::future::Future;
use std::pin::{Pin, pin};
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Config, Error, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

/// One statement parameter with its PostgreSQL type.
pub type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// Why a bounded connect failed.
#[derive(Debug)]
pub enum ConnectError {
    /// The driver's error (refused, authentication, TLS, the TCP `connect_timeout`).
    Driver(Error),
    /// No answer within the bound: the startup or authentication stalled.
    NoAnswer,
    /// The client's runtime could not be built (no file descriptors left).
    Runtime(std::io::Error),
}

/// The runtime, the connection's task, and the deadline of the calls running now.
struct Runner {
    runtime: Runtime,
    connection: AbortHandle,
    deadline: Cell<Option<Instant>>,
    fired: Cell<bool>,
}

impl Runner {
    /// Runs `call` to its end, or to the deadline: then the connection is aborted, which ends the
    /// call with "connection closed" (the call waits only on channels the connection's task holds).
    fn run<T>(&self, call: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        let deadline = self.deadline.get().filter(|_| !self.fired.get());
        self.runtime.block_on(async {
            let mut call = pin!(call);
            if let Some(deadline) = deadline {
                tokio::select! {
                    biased;
                    done = &mut call => return done,
                    () = tokio::time::sleep_until(deadline) => {
                        self.fired.set(true);
                        self.connection.abort();
                    }
                }
            }
            call.await
        })
    }
}

/// A PostgreSQL client whose calls are bounded by [`Client::within`].
pub struct Client {
    runner: Runner,
    client: tokio_postgres::Client,
}

impl Client {
    /// Connects; the TCP connect, TLS, startup and authentication together within `bound`.
    pub fn connect(config: &Config, tls: MakeRustlsConnect, bound: Duration) -> Result<Client, ConnectError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(ConnectError::Runtime)?;
        let connected = runtime.block_on(async { tokio::time::timeout(bound, config.connect(tls)).await });
        let (client, connection) = match connected {
            Ok(Ok(pair)) => pair,
            Ok(Err(error)) => return Err(ConnectError::Driver(error)),
            Err(_elapsed) => return Err(ConnectError::NoAnswer),
        };
        // Driven whenever a call blocks on the runtime; its end (an error or the server closing)
        // closes the client, which `is_closed` reports.
        let connection = runtime
            .spawn(async move {
                if let Err(error) = connection.await {
                    tracing::debug!("PostgreSQL connection ended: {error}");
                }
            })
            .abort_handle();
        let runner = Runner { runtime, connection, deadline: Cell::new(None), fired: Cell::new(false) };
        Ok(Client { runner, client })
    }

    /// Runs `body`, every call in it ending by `bound` from now: past it the connection is
    /// dropped and each call fails. The second value says the bound fired.
    pub fn within<T>(&mut self, bound: Duration, body: impl FnOnce(&mut Client) -> T) -> (T, bool) {
        self.runner.deadline.set(Some(Instant::now() + bound));
        self.runner.fired.set(false);
        let value = body(self);
        self.runner.deadline.set(None);
        (value, self.runner.fired.get())
    }

    /// Whether the connection is gone (the server closed it, or a bound fired).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    pub fn transaction(&mut self) -> Result<Transaction<'_>, Error> {
        let Client { runner, client } = self;
        Ok(Transaction { runner, inner: runner.run(client.transaction())? })
    }

    /// A `READ ONLY` transaction.
    pub fn read_only_transaction(&mut self) -> Result<Transaction<'_>, Error> {
        let Client { runner, client } = self;
        Ok(Transaction { runner, inner: runner.run(client.build_transaction().read_only(true).start())? })
    }
}

/// A transaction; dropped without [`Transaction::commit`] it rolls back (the driver's own drop).
pub struct Transaction<'a> {
    runner: &'a Runner,
    inner: tokio_postgres::Transaction<'a>,
}

impl Transaction<'_> {
    pub fn commit(self) -> Result<(), Error> {
        self.runner.run(self.inner.commit())
    }

    pub fn rollback(self) -> Result<(), Error> {
        self.runner.run(self.inner.rollback())
    }

    /// `COPY … FROM STDIN (FORMAT binary)` of rows whose columns have `types`.
    pub fn copy_in_binary(&mut self, sql: &str, types: &[Type]) -> Result<BinaryCopyIn<'_>, Error> {
        let sink = self.runner.run(self.inner.copy_in(sql))?;
        Ok(BinaryCopyIn { runner: self.runner, writer: Box::pin(BinaryCopyInWriter::new(sink, types)) })
    }
}

/// A binary `COPY` in progress: [`BinaryCopyIn::write`] each row, then [`BinaryCopyIn::finish`]
/// (dropped before that, the `COPY` and its transaction fail).
pub struct BinaryCopyIn<'a> {
    runner: &'a Runner,
    writer: Pin<Box<BinaryCopyInWriter>>,
}

impl BinaryCopyIn<'_> {
    pub fn write(&mut self, row: &[&(dyn ToSql + Sync)]) -> Result<(), Error> {
        self.runner.run(self.writer.as_mut().write(row))
    }

    /// Ends the `COPY`; returns the rows written.
    pub fn finish(mut self) -> Result<u64, Error> {
        self.runner.run(self.writer.as_mut().finish())
    }
}

/// The statements a client and a transaction both run.
pub trait Statements {
    fn query_typed(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, Error>;
    /// Exactly one row, or an error.
    fn query_typed_one(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Row, Error>;
    fn execute_typed(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, Error>;
    fn batch_execute(&mut self, sql: &str) -> Result<(), Error>;
}

impl Statements for Client {
    fn query_typed(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, Error> {
        self.runner.run(self.client.query_typed(sql, params))
    }

    fn query_typed_one(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Row, Error> {
        self.runner.run(self.client.query_typed_one(sql, params))
    }

    fn execute_typed(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, Error> {
        self.runner.run(self.client.execute_typed(sql, params))
    }

    fn batch_execute(&mut self, sql: &str) -> Result<(), Error> {
        self.runner.run(self.client.batch_execute(sql))
    }
}

impl Statements for Transaction<'_> {
    fn query_typed(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, Error> {
        self.runner.run(self.inner.query_typed(sql, params))
    }

    fn query_typed_one(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Row, Error> {
        self.runner.run(self.inner.query_typed_one(sql, params))
    }

    fn execute_typed(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, Error> {
        self.runner.run(self.inner.execute_typed(sql, params))
    }

    fn batch_execute(&mut self, sql: &str) -> Result<(), Error> {
        self.runner.run(self.inner.batch_execute(sql))
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use super::Statements;
    use crate::ledger::PgConnection;

    /// A server that answers the startup (when `answers_startup`: authentication ok, ready for
    /// queries) and then reads whatever comes without ever answering: a hung pooler.
    fn silent_server(answers_startup: bool) -> (u16, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            if answers_startup {
                let mut length = [0u8; 4];
                stream.read_exact(&mut length).unwrap();
                let mut startup = vec![0u8; u32::from_be_bytes(length) as usize - 4];
                stream.read_exact(&mut startup).unwrap();
                // AuthenticationOk, ReadyForQuery (idle).
                stream.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 0, b'Z', 0, 0, 0, 5, b'I']).unwrap();
            }
            let mut sink = [0u8; 4096];
            while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
        });
        (port, server)
    }

    fn url(port: u16) -> String {
        format!("postgres://tester@127.0.0.1:{port}/db?sslmode=disable")
    }

    #[test]
    fn a_call_on_a_connection_that_stalls_after_connecting_ends_at_the_bound() {
        let (port, server) = silent_server(true);
        let mut connection = PgConnection::open(&url(port), Duration::from_millis(500)).unwrap();
        let started = Instant::now();
        let (answer, fired) = connection.within(|client| client.query_typed("SELECT 1", &[])).unwrap();
        let took = started.elapsed();
        let error = answer.expect_err("nothing answers");
        assert!(fired, "the bound fired: {error}");
        assert!(error.is_closed(), "the call ends as on a closed connection: {error}");
        assert!(took < Duration::from_secs(10), "ended after {took:?}");
        // The connection was dropped: the server reads the end of the stream and its thread ends.
        server.join().unwrap();
        // The next call reconnects (and is refused: the server is gone), it does not hang.
        let again = connection.within(|client| client.query_typed("SELECT 1", &[]));
        assert!(again.is_err(), "the server is gone");
    }

    #[test]
    fn a_connect_whose_startup_never_gets_an_answer_ends_at_the_bound() {
        let (port, _server) = silent_server(false);
        let started = Instant::now();
        let error = PgConnection::open(&url(port), Duration::from_secs(1)).err().expect("nothing answers");
        assert!(started.elapsed() < Duration::from_secs(10), "ended after {:?}", started.elapsed());
        assert!(error.to_string().contains("no answer within 1 s while connecting"), "{error}");
        // Reach the server once more so its accept loop ends.
        drop(TcpStream::connect(("127.0.0.1", port)));
    }
}
