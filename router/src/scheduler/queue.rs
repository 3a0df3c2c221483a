//! The waiting queue and its admission rule: first come, first served, under a prefill
//! token budget and a KV-cache token budget.

use std::collections::VecDeque;
use std::time::Instant;

use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::infer::{InferEvent, ValidRequest};

pub type EventSender = mpsc::UnboundedSender<Result<InferEvent, ApiError>>;

/// A request inside the scheduler.
#[derive(Debug)]
pub struct Entry {
    pub request: ValidRequest,
    pub tx: EventSender,
    pub queued_at: Instant,
    /// When the last token (or the prompt) was answered, for inter-token latency.
    pub last_event_at: Option<Instant>,
}

impl Entry {
    pub fn new(request: ValidRequest, tx: EventSender) -> Self {
        Self {
            request,
            tx,
            queued_at: Instant::now(),
            last_event_at: None,
        }
    }

    /// The client went away (disconnect, or it saw a stop sequence).
    pub fn is_cancelled(&self) -> bool {
        self.tx.is_closed()
    }

    pub fn fail(&self, error: ApiError) {
        // A receiver that is gone needs no answer.
        let _ = self.tx.send(Err(error));
    }
}

#[derive(Debug, Default)]
pub struct Queue {
    entries: VecDeque<Entry>,
}

/// The budgets one new prefill batch must respect.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Fewest requests worth a prefill that interrupts the running batch.
    pub min_size: usize,
    /// Sum of prompt tokens.
    pub prefill_tokens: u32,
    /// Sum of prompt + max_new_tokens, what the shard's KV cache still has room for.
    pub total_tokens: u32,
}

impl Queue {
    pub fn push(&mut self, entry: Entry) {
        self.entries.push_back(entry);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets requests whose client went away before they ran.
    pub fn drop_cancelled(&mut self) {
        self.entries.retain(|e| !e.is_cancelled());
    }

    /// Takes the longest prefix of the queue that fits the budget, if it has at least
    /// `min_size` requests. Strict FIFO: a request that does not fit blocks the ones
    /// behind it, so a long prompt is never starved by a stream of short ones.
    pub fn next_batch(&mut self, budget: Budget) -> Option<Vec<Entry>> {
        let (mut prefill, mut total, mut n) = (0u32, 0u32, 0usize);
        for e in &self.entries {
            let input = e.request.input_ids.len() as u32;
            let reserved = e.request.reserved_tokens();
            if prefill + input > budget.prefill_tokens || total + reserved > budget.total_tokens {
                break;
            }
            prefill += input;
            total += reserved;
            n += 1;
        }
        if n == 0 || n < budget.min_size {
            return None;
        }
        Some(self.entries.drain(..n).collect())
    }

    /// Removes the head: used when it can never fit an empty shard.
    pub fn pop_front(&mut self) -> Option<Entry> {
        self.entries.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(input: usize, max_new: u32) -> (Entry, crate::infer::EventReceiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        let request = ValidRequest::greedy(vec![1; input], max_new);
        (Entry::new(request, tx), rx)
    }

    fn budget(min_size: usize, prefill_tokens: u32, total_tokens: u32) -> Budget {
        Budget {
            min_size,
            prefill_tokens,
            total_tokens,
        }
    }

    #[test]
    fn takes_the_prefix_that_fits_both_budgets() {
        let mut q = Queue::default();
        let mut keep = Vec::new();
        for (input, max_new) in [(10, 10), (10, 10), (10, 100), (1, 1)] {
            let (e, rx) = entry(input, max_new);
            q.push(e);
            keep.push(rx);
        }
        // Prefill budget 25 admits two prompts; the third would make 30.
        let batch = q.next_batch(budget(0, 25, 1000)).unwrap();
        assert_eq!(batch.len(), 2);
        // Total budget 100 cannot hold the 110 tokens of the next one, and FIFO blocks the
        // 4th behind it; 112 holds both.
        assert!(q.next_batch(budget(0, 100, 100)).is_none());
        assert_eq!(q.next_batch(budget(0, 100, 112)).unwrap().len(), 2);
        assert!(q.is_empty());
    }

    #[test]
    fn waits_for_min_size_and_drops_cancelled() {
        let mut q = Queue::default();
        let (a, _rx_a) = entry(4, 4);
        let (b, rx_b) = entry(4, 4);
        q.push(a);
        q.push(b);
        assert!(q.next_batch(budget(3, 100, 100)).is_none());
        assert_eq!(q.len(), 2);
        drop(rx_b);
        q.drop_cancelled();
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_batch(budget(1, 100, 100)).unwrap().len(), 1);
    }
}
