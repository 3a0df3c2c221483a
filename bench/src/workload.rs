//! The fixed prompt set and the closed loop that sends it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::bail;
use sonde_tokenizer::ModelTokenizer;

use crate::client::{Api, Client, Outcome};

/// Public-domain opening lines, so prompts are real text (tokenizers behave as on real
/// traffic) and every run sends the same ones.
const TEXTS: &[&str] = &[
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was the season of Darkness",
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and nothing particular to interest me on shore, I thought I would sail about a little and see the watery part of the world",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife. However little known the feelings or views of such a man may be on his first entering a neighbourhood",
    "In a hole in the ground there lived a creature. Not a nasty, dirty, wet hole, filled with the ends of worms and an oozy smell, nor yet a dry, bare, sandy hole with nothing in it to sit down on or to eat",
    "Happy families are all alike; every unhappy family is unhappy in its own way. Everything was in confusion in the house. The wife had discovered that the husband was carrying on an intrigue with a French girl",
    "The sun shone, having no alternative, on the nothing new. Murphy sat out of it, as though he were free, in a mew in West Brompton. Here for what might have been six months he had eaten, drunk, slept",
    "Once upon a time and a very good time it was there was a moocow coming down along the road and this moocow that was coming down along the road met a nicens little boy",
    "All this happened, more or less. The war parts, anyway, are pretty much true. One guy I knew really was shot in Dresden for taking a teapot that wasn't his. Another guy I knew really did threaten",
];

pub struct Workload {
    prompts: Vec<String>,
    /// With an exact token count: every request's whole prompt, by request number.
    exact: Vec<String>,
    pub max_tokens: u32,
    /// Differs between runs, so a second run does not meet the first one's prompts in a
    /// server's cache either.
    run: u32,
    /// A context every prompt starts with (a scoring workload: one passage, many
    /// candidate endings); empty by default.
    shared: String,
}

impl Workload {
    /// Prompts of about `words` words: each text repeated and cut.
    pub fn new(words: usize, max_tokens: u32) -> Self {
        let prompts = TEXTS
            .iter()
            .map(|text| {
                let mut all: Vec<&str> = Vec::new();
                while all.len() < words {
                    all.extend(text.split_whitespace());
                }
                all.truncate(words.max(1));
                all.join(" ")
            })
            .collect();
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Self {
            prompts,
            exact: Vec::new(),
            max_tokens,
            run,
            shared: String::new(),
        }
    }

    /// Every prompt starts with the same context of about `words` words (numbered by the
    /// run, so runs do not share it), then goes on as its own prompt.
    pub fn shared_prefix(mut self, words: usize) -> Self {
        let text: Vec<&str> = TEXTS
            .iter()
            .flat_map(|t| t.split_whitespace())
            .cycle()
            .take(words)
            .collect();
        self.shared = format!("Context {}. {}\n\n", self.run, text.join(" "));
        self
    }

    /// Cuts the prompts of requests `0..count` to exactly `tokens` tokens of `tokenizer`
    /// (the served model's: the count a server sees), at token boundaries. The texts must
    /// be long enough: build the workload with about twice as many words as tokens.
    pub fn exact_tokens(
        mut self,
        tokenizer: &ModelTokenizer,
        tokens: usize,
        count: usize,
    ) -> anyhow::Result<Self> {
        let mut exact = Vec::with_capacity(count);
        for i in 0..count {
            let full = self.prompt(i);
            let spans = tokenizer.encode_with_offsets(&full, false)?;
            let Some(last) = spans.get(tokens.saturating_sub(1)) else {
                bail!("prompt {i} has {} tokens, fewer than {tokens}", spans.len());
            };
            let mut text = full[..last.stop].to_string();
            // A cut can merge differently than the whole text did; drop what is over.
            while tokenizer.encode(&text, false)?.len() > tokens {
                text.pop();
            }
            let got = tokenizer.encode(&text, false)?.len();
            if got != tokens {
                bail!("prompt {i} cut to {tokens} tokens re-encodes to {got}");
            }
            exact.push(text);
        }
        self.exact = exact;
        Ok(self)
    }

    /// Request `i`'s prompt, starting with its own number: no two requests share a prefix
    /// (unless asked to, with [`Workload::shared_prefix`]), so a server's prompt cache
    /// (llama-server reuses the KV of a repeated prefix; Sonde has a prefix cache) cannot
    /// make a request cheaper than real traffic would.
    pub fn prompt(&self, i: usize) -> String {
        if let Some(p) = self.exact.get(i) {
            return p.clone();
        }
        format!(
            "{}Request {}-{i}. {}",
            self.shared,
            self.run,
            self.prompts[i % self.prompts.len()]
        )
    }
}

impl Workload {
    /// Request `i` as a scoring call: the shared context as the query, and `items` endings
    /// (each its own, numbered) as the items: the same texts that `items` separate requests
    /// with this context would send.
    pub fn query_and_items(&self, i: usize, items: usize) -> (String, Vec<String>) {
        let endings = (0..items)
            .map(|k| {
                format!(
                    "Request {}-{i}-{k}. {}",
                    self.run,
                    self.prompts[k % self.prompts.len()]
                )
            })
            .collect();
        (self.shared.clone(), endings)
    }

    /// Sends request `i` as `client`'s API says.
    pub async fn send(&self, client: &Client, i: usize) -> Outcome {
        match client.api() {
            Api::Score { items } => {
                let (query, items) = self.query_and_items(i, items);
                client.score(&query, &items).await
            }
            _ => client.run(&self.prompt(i), self.max_tokens).await,
        }
    }
}

/// `concurrency` clients share a counter of requests left; each sends its next request as
/// soon as its previous one ended.
pub async fn closed_loop(
    client: &Client,
    workload: &Workload,
    concurrency: usize,
    requests: usize,
) -> Vec<Outcome> {
    let next = Arc::new(AtomicUsize::new(0));
    let workers = (0..concurrency.max(1)).map(|_| {
        let next = next.clone();
        async move {
            let mut outcomes = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    return outcomes;
                }
                outcomes.push(workload.send(client, i).await);
            }
        }
    });
    futures::future::join_all(workers)
        .await
        .into_iter()
        .flatten()
        .collect()
}
