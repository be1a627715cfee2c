//! Tool search: ranks the tools a caller may use by relevance to a question in plain
//! words, so an agent can find one among thousands without every schema in its context.
//!
//! Ranking is BM25 (the `bm25` crate's embedder and scorer) over each tool's server,
//! name, titles, description and parameter names and descriptions, with the server,
//! name and titles counted twice. Words are split at every character that is not a
//! letter or digit and at camelCase, lowercased,
//! stripped of common English words and stemmed (Snowball). A query word from a small
//! table of verbs and nouns that tools name differently ("rename" / "move", "picture" /
//! "image") also looks for its siblings, at half weight, so a paraphrase still finds
//! the tool while a literal match ranks first.
//!
//! The index is built from the caller's own listing, so it follows every change the
//! listing follows (`ToolsChanged`, grants) and never holds a tool the caller may not
//! use. Built indexes are kept for the few most recent distinct listings, known by
//! their definitions' addresses (the same listing read from the cache again) and else
//! by their content (the same tools fetched anew, from a server whose list is never
//! cached); searches of a listing whose index is being built wait for that build rather
//! than start their own. An index holds no definition: its results are the caller's own
//! tools, by place.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Weak};

use bm25::{
    Embedder, EmbedderBuilder, Embedding, Scorer, TokenEmbedder, TokenEmbedding, Tokenizer,
};
use rust_stemmers::{Algorithm, Stemmer};
use serde_json::Value;

use super::catalog::ToolInfo;

/// One tool a search found, with its BM25 score (higher is more relevant; comparable
/// only within one search).
#[derive(Clone, Debug)]
pub struct ToolMatch {
    /// The tool, as [`list_tools`](crate::HarnessHandle::list_tools) gives it.
    pub tool: ToolInfo,
    /// Its relevance to the query.
    pub score: f32,
}

/// Indexes kept, one per distinct listing (agents with different grants see different
/// lists).
const KEPT: usize = 8;
/// Indexes kept of listings of the same tools (by name) that say different things:
/// one whose server writes something new at every listing (a `ttlMs: 0` list with a
/// counter in it) takes the place of its own oldest, not the other listings'.
const KEPT_OF_ONE_SHAPE: usize = 2;
/// Text read of one field of a definition: a server's description is not a book.
const FIELD_CHARS: usize = 4096;
/// Parameters read of one tool.
const PARAMS: usize = 64;
/// Bytes of one tool's text indexed, its fields together: the fields' own bounds
/// add up to half a megabyte, which a hostile server could fill with distinct words.
const DOCUMENT_BYTES: usize = 16 * 1024;
/// Distinct terms indexed of one tool: each costs the index an entry of its own
/// (about 100 bytes).
const TOOL_TERMS: usize = 1024;
/// Distinct terms indexed of one listing, shared out among its tools by what each
/// has (each keeps at least [`MIN_TOOL_TERMS`]): many tools within their own bounds
/// must not add up.
const LISTING_TERMS: usize = 128 * 1024;
/// The fewest terms of a tool indexed, however many tools a listing has: its server's,
/// name's and title's first words (a document begins with them). Past
/// `LISTING_TERMS / MIN_TOOL_TERMS` tools (16,384) a listing holds more than
/// [`LISTING_TERMS`], 8 a tool: a server's 20,000 tools of distinct words, 160,000.
const MIN_TOOL_TERMS: usize = 8;
/// Characters read of a query.
const QUERY_CHARS: usize = 1024;
/// Terms of a query searched for, and sibling terms: each costs a scan of every
/// matching tool's terms.
const QUERY_TERMS: usize = 32;
/// Weight of a word found only through its siblings in [`SIBLINGS`].
const SIBLING_WEIGHT: f32 = 0.5;

/// Words that say nothing about which tool is meant.
const STOP_WORDS: &[&str] = &[
    "a", "all", "an", "and", "any", "are", "as", "at", "be", "by", "can", "could", "did", "do",
    "does", "for", "from", "has", "have", "how", "i", "in", "into", "is", "it", "its", "just",
    "me", "my", "of", "on", "or", "our", "out", "please", "should", "so", "some", "that", "the",
    "their", "them", "then", "there", "these", "this", "to", "up", "us", "use", "using", "via",
    "was", "we", "what", "when", "where", "which", "who", "will", "with", "would", "you", "your",
];

/// Groups of words that tools and people use for the same thing.
const SIBLINGS: &[&[&str]] = &[
    &["create", "add", "new", "make", "open"],
    &["delete", "remove", "drop", "destroy", "erase"],
    &["update", "edit", "modify", "change", "set", "patch"],
    &[
        "get", "read", "fetch", "retrieve", "show", "view", "load", "look",
    ],
    &["list", "enumerate", "browse"],
    &["search", "find", "query", "lookup", "locate"],
    &["move", "rename", "relocate", "transition"],
    &[
        "run", "execute", "exec", "invoke", "start", "launch", "trigger",
    ],
    &["stop", "halt", "kill", "terminate", "cancel"],
    &[
        "image",
        "picture",
        "photo",
        "screenshot",
        "media",
        "png",
        "jpg",
    ],
    &["folder", "directory", "dir"],
    &["repo", "repository"],
    &["pr", "pull"],
    &["k8s", "kubernetes", "kubectl"],
    &["doc", "document", "documentation", "docs"],
    &["link", "relation", "relationship"],
    &["comment", "reply", "note"],
    &["issue", "ticket", "bug"],
    &["upload", "attach"],
    &["download", "save", "export"],
    &["children", "child", "nested", "sub", "subpage"],
    &["structure", "schema", "shape", "layout"],
    &["height", "elevation", "altitude"],
];

/// Splits identifiers and prose into lowercase words: `list_allowedDirectories` gives
/// `list`, `allowed`, `directories`.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in text.chars() {
        if c.is_alphanumeric() {
            if c.is_uppercase() && prev_lower && !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            prev_lower = c.is_lowercase() || c.is_numeric();
            word.extend(c.to_lowercase());
        } else {
            prev_lower = false;
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out.into_iter()
}

/// Words to index terms: stop words out, the rest stemmed.
struct Terms {
    stemmer: Stemmer,
}

impl Terms {
    fn new() -> Terms {
        Terms {
            stemmer: Stemmer::create(Algorithm::English),
        }
    }

    fn term(&self, word: &str) -> Option<String> {
        if STOP_WORDS.contains(&word) {
            return None;
        }
        Some(self.stemmer.stem(word).into_owned())
    }

    /// A query's terms, each once, then the terms only its siblings bring.
    fn query(&self, query: &str) -> (Vec<String>, Vec<String>) {
        let query: String = query.chars().take(QUERY_CHARS).collect();
        let mut base = Vec::new();
        let mut siblings = Vec::new();
        for word in words(&query) {
            let Some(term) = self.term(&word) else {
                continue;
            };
            if base.len() >= QUERY_TERMS {
                break;
            }
            if !base.contains(&term) {
                base.push(term);
            }
            for group in SIBLINGS.iter().filter(|g| g.contains(&word.as_str())) {
                for sibling in group.iter().filter(|s| **s != word) {
                    let term = self.stemmer.stem(sibling).into_owned();
                    if siblings.len() < QUERY_TERMS && !siblings.contains(&term) {
                        siblings.push(term);
                    }
                }
            }
        }
        siblings.retain(|t| !base.contains(t));
        (base, siblings)
    }
}

impl Tokenizer for Terms {
    fn tokenize(&self, input_text: &str) -> Vec<String> {
        words(input_text).filter_map(|w| self.term(&w)).collect()
    }
}

/// The text a tool is found by.
fn document(tool: &ToolInfo) -> String {
    fn cut(text: &str) -> &str {
        match text.char_indices().nth(FIELD_CHARS) {
            Some((end, _)) => &text[..end],
            None => text,
        }
    }
    fn field(value: Option<&Value>) -> &str {
        cut(value.and_then(Value::as_str).unwrap_or(""))
    }
    /// Adds ` part`, cut where the document would pass [`DOCUMENT_BYTES`]: the text is
    /// never larger than the budget, however large what a server wrote.
    fn push(text: &mut String, part: &str) {
        let room = DOCUMENT_BYTES.saturating_sub(text.len() + 1);
        if room == 0 {
            return;
        }
        let mut end = part.len().min(room);
        while !part.is_char_boundary(end) {
            end -= 1;
        }
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&part[..end]);
    }
    let def = &*tool.definition;
    let head = [
        cut(&tool.server),
        cut(&tool.name),
        field(def.get("title")),
        field(def.get("annotations").and_then(|a| a.get("title"))),
    ];
    let mut text = String::new();
    // The names and titles count twice.
    for part in head.iter().chain(head.iter()) {
        push(&mut text, part);
    }
    push(&mut text, field(def.get("description")));
    if let Some(props) = def
        .get("inputSchema")
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
    {
        for (name, schema) in props.iter().take(PARAMS) {
            push(&mut text, cut(name));
            push(&mut text, field(schema.get("description")));
        }
    }
    text
}

/// `embedding` with each term once: the embedder gives one entry per occurrence, all
/// with the same value, and the scorer takes the first it finds, scanning the whole
/// list for each term of a query (a tool that repeats one word a hundred thousand
/// times would make every search scan them all).
fn unique(mut embedding: Embedding<u32>, most: usize) -> Embedding<u32> {
    let mut seen = std::collections::HashSet::new();
    embedding.0.retain(|t| seen.insert(t.index));
    embedding.0.truncate(most);
    // Not the room of every occurrence, for the index's life.
    embedding.0.shrink_to_fit();
    embedding
}

/// The most each of several takes of `budget` when each needs `needs`: an equal share,
/// what one needs less of handed on to the others (`usize::MAX`: all fit).
fn fair_share(needs: &[usize], budget: usize) -> usize {
    let mut sorted = needs.to_vec();
    sorted.sort_unstable();
    let mut left = budget;
    for (i, need) in sorted.iter().enumerate() {
        let share = left / (sorted.len() - i);
        if *need > share {
            return share;
        }
        left -= need;
    }
    usize::MAX
}

/// The distinct terms indexed of each tool of one server whose tools have `counts`
/// (each at most [`TOOL_TERMS`]) and share `budget`: the largest share such that their
/// total stays within it (a tool with fewer leaves the rest to the others), and never
/// less than [`MIN_TOOL_TERMS`].
fn tool_terms(counts: &[usize], budget: usize) -> usize {
    fair_share(counts, budget).clamp(MIN_TOOL_TERMS, TOOL_TERMS)
}

/// One listing, indexed.
struct Built {
    /// Its tools' qualified names, by place: ties are broken by them, and a result is
    /// given only if the caller's tool at its place has its name.
    names: Vec<Arc<str>>,
    terms: Terms,
    scorer: Scorer<u32>,
    /// Terms indexed, its tools' together: what its size follows.
    #[cfg(test)]
    indexed: usize,
}

impl Built {
    fn new(tools: Vec<ToolInfo>) -> Built {
        let names = tools.iter().map(|t| t.qualified.clone()).collect();
        let tools_servers: Vec<Arc<str>> = tools.iter().map(|t| t.server.clone()).collect();
        let texts: Vec<String> = tools.iter().map(document).collect();
        // The definitions are not kept: an index must not hold a listing the cache let go.
        drop(tools);
        let corpus: Vec<&str> = texts.iter().map(String::as_str).collect();
        let embedder: Embedder<u32, Terms> =
            EmbedderBuilder::with_tokenizer_and_fit_to_corpus(Terms::new(), &corpus).build();
        let mut scorer = Scorer::new();
        // Counted first, then embedded again: all embeddings at once could hold
        // thousands of tools' terms.
        let counts: Vec<usize> = texts
            .iter()
            .map(|t| unique(embedder.embed(t), TOOL_TERMS).0.len())
            .collect();
        // [`LISTING_TERMS`] is shared out among servers first, as a server's among its
        // tools: a server with thousands of wordy tools cuts its own tools' share, not
        // every other server's, and one that needs less leaves the rest to the others.
        let mut of_server: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, t) in tools_servers.iter().enumerate() {
            of_server.entry(t).or_default().push(i);
        }
        let servers: Vec<Vec<usize>> = of_server.into_values().collect();
        let needs: Vec<usize> = servers
            .iter()
            .map(|places| places.iter().map(|&i| counts[i]).sum())
            .collect();
        let share = fair_share(&needs, LISTING_TERMS);
        let mut most = vec![TOOL_TERMS; texts.len()];
        for (places, need) in servers.iter().zip(&needs) {
            let counts: Vec<usize> = places.iter().map(|&i| counts[i]).collect();
            let cap = tool_terms(&counts, share.min(*need));
            for &i in places {
                most[i] = cap;
            }
        }
        let mut indexed = 0;
        for ((i, text), most) in (0u32..).zip(&texts).zip(most) {
            let embedding = unique(embedder.embed(text), most);
            indexed += embedding.0.len();
            scorer.upsert(&i, embedding);
        }
        tracing::debug!(
            tools = texts.len(),
            terms = indexed,
            "tool search index built"
        );
        Built {
            names,
            terms: Terms::new(),
            scorer,
            #[cfg(test)]
            indexed,
        }
    }

    /// The places of the `k` tools most relevant to `query`, best first, with scores.
    fn search(&self, query: &str, k: usize) -> Vec<(usize, f32)> {
        fn embedding(terms: &[String]) -> Embedding<u32> {
            Embedding(
                terms
                    .iter()
                    .map(|t| TokenEmbedding {
                        index: u32::embed(t),
                        value: 1.0,
                    })
                    .collect(),
            )
        }
        let (base, siblings) = self.terms.query(query);
        let mut scores: HashMap<u32, f32> = HashMap::new();
        for m in self.scorer.matches(&embedding(&base)) {
            *scores.entry(m.id).or_default() += m.score;
        }
        for m in self.scorer.matches(&embedding(&siblings)) {
            *scores.entry(m.id).or_default() += SIBLING_WEIGHT * m.score;
        }
        let mut ranked: Vec<(u32, f32)> = scores.into_iter().collect();
        // Ties go by qualified name, so the same question gets the same answer.
        let name = |i: u32| self.names.get(i as usize);
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| name(a.0).cmp(&name(b.0))));
        ranked
            .into_iter()
            .take(k)
            .map(|(i, score)| (i as usize, score))
            .collect()
    }
}

/// Which listing this is: its names and the very definitions it holds (their
/// addresses, which the entry's weak references keep from being reused).
fn by_address(tools: &[ToolInfo]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for t in tools {
        t.qualified.hash(&mut h);
        (Arc::as_ptr(&t.definition) as usize).hash(&mut h);
    }
    h.finish()
}

/// Which tools a listing has, by name, whatever they say.
fn by_names(tools: &[ToolInfo]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for t in tools {
        t.qualified.hash(&mut h);
    }
    h.finish()
}

/// Which listing this is: its names and what its definitions say. Read when its
/// addresses are new: a list that is never cached is fetched anew for every search,
/// the same tools at new addresses.
fn by_content(tools: &[ToolInfo]) -> u64 {
    /// Feeds what is written to it to the hasher.
    struct Feed<'a>(&'a mut std::collections::hash_map::DefaultHasher);
    impl std::io::Write for Feed<'_> {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.write(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for t in tools {
        t.qualified.hash(&mut h);
        // Writing a Value to a sink that takes everything cannot fail.
        let _ = serde_json::to_writer(Feed(&mut h), &*t.definition);
        h.write_u8(0xff);
    }
    h.finish()
}

/// One listing searched lately, and its index.
struct Listed {
    by_address: u64,
    /// The definitions it was last seen with, held weakly: their addresses are not
    /// reused while this stands (a new listing at an old address would pass for this
    /// one), and the listing itself is freed when the cache lets it go.
    seen: Vec<Weak<Value>>,
    by_content: u64,
    by_names: u64,
    slot: Slot,
}

impl Listed {
    fn new(tools: &[ToolInfo], by_address: u64, by_content: u64, by_names: u64) -> Listed {
        Listed {
            by_address,
            seen: tools
                .iter()
                .map(|t| Arc::downgrade(&t.definition))
                .collect(),
            by_content,
            by_names,
            slot: Slot::default(),
        }
    }

    /// Whether `tools` hold the very definitions this listing was last seen with.
    fn holds(&self, tools: &[ToolInfo], address: u64) -> bool {
        self.by_address == address
            && self.seen.len() == tools.len()
            && self
                .seen
                .iter()
                .zip(tools)
                .all(|(seen, t)| std::ptr::eq(seen.as_ptr(), Arc::as_ptr(&t.definition)))
    }
}

/// One listing's index, built once however many search it at once.
type Slot = Arc<tokio::sync::OnceCell<Arc<Built>>>;

/// Why a build was not made (not logged: nobody waits for it).
const ABANDONED: &str = "abandoned";

/// Indexes built at once: a listing that is never cached (a server's `ttlMs: 0`) is a
/// new listing at every search, and its searches would otherwise each take a
/// blocking thread and a core.
const BUILDS_AT_ONCE: usize = 2;

/// The indexes of the listings searched last, the newest first.
pub(crate) struct SearchIndex {
    built: Arc<parking_lot::Mutex<Vec<Listed>>>,
    building: Arc<tokio::sync::Semaphore>,
    /// Indexes built, for tests.
    #[cfg(test)]
    builds: Arc<std::sync::atomic::AtomicUsize>,
}

impl Default for SearchIndex {
    fn default() -> Self {
        SearchIndex {
            built: Arc::default(),
            building: Arc::new(tokio::sync::Semaphore::new(BUILDS_AT_ONCE)),
            #[cfg(test)]
            builds: Arc::default(),
        }
    }
}

impl SearchIndex {
    /// [`SearchIndex::search`], given up at `until` (`None` then): a search may wait
    /// for its index's build behind others'. The build goes on (the next search finds
    /// it).
    pub(crate) async fn search_until(
        &self,
        tools: Vec<ToolInfo>,
        query: &str,
        k: usize,
        until: tokio::time::Instant,
    ) -> Option<Vec<ToolMatch>> {
        tokio::time::timeout_at(until, self.search(tools, query, k))
            .await
            .ok()
    }

    /// The `k` tools of `tools` (a caller's listing) most relevant to `query`, best first.
    pub(crate) async fn search(
        &self,
        tools: Vec<ToolInfo>,
        query: &str,
        k: usize,
    ) -> Vec<ToolMatch> {
        if k == 0 || tools.is_empty() {
            return Vec::new();
        }
        let address = by_address(&tools);
        let seen = {
            let mut built = self.built.lock();
            built
                .iter()
                .position(|l| l.holds(&tools, address))
                .map(|i| {
                    let entry = built.remove(i);
                    let slot = entry.slot.clone();
                    built.insert(0, entry);
                    slot
                })
        };
        let slot = match seen {
            Some(slot) => slot,
            None => {
                // Reading every definition is CPU work in proportion to the listing.
                let hashed = tools.clone();
                let content = tokio::task::spawn_blocking(move || by_content(&hashed))
                    .await
                    .unwrap_or(address);
                let names = by_names(&tools);
                let mut built = self.built.lock();
                let entry = match built.iter().position(|l| l.by_content == content) {
                    // The same tools at new addresses: its index serves, and it is
                    // known by these from now on.
                    Some(i) => {
                        let old = built.remove(i);
                        Listed {
                            slot: old.slot,
                            ..Listed::new(&tools, address, content, names)
                        }
                    }
                    None => Listed::new(&tools, address, content, names),
                };
                let slot = entry.slot.clone();
                built.insert(0, entry);
                let mut shape = 0;
                built.retain(|l| {
                    shape += usize::from(l.by_names == names);
                    l.by_names != names || shape <= KEPT_OF_ONE_SHAPE
                });
                built.truncate(KEPT);
                slot
            }
        };
        let built = match slot.get() {
            Some(index) => Ok(index.clone()),
            None => {
                #[cfg(test)]
                let builds = self.builds.clone();
                let (turns, listed) = (self.building.clone(), self.built.clone());
                let to_index = tools.clone();
                let interest = Arc::new(());
                let wanted = Arc::downgrade(&interest);
                // On a task of its own, which holds the slot until the index is in it: a
                // search given up (its client gone) does not throw the build away, and
                // the searches after it wait for this one instead of starting their own.
                // Builds take turns; one whose listing is no longer kept, and whose
                // search is gone, is not made when its turn comes.
                let building = tokio::spawn(async move {
                    let init = || async {
                        let _turn = turns.acquire_owned().await.map_err(|e| e.to_string())?;
                        let kept = listed.lock().iter().any(|l| Arc::ptr_eq(&l.slot, &slot));
                        if !kept && wanted.strong_count() == 0 {
                            return Err(ABANDONED.to_string());
                        }
                        #[cfg(test)]
                        builds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        // Stemming a few thousand definitions is CPU work for milliseconds.
                        tokio::task::spawn_blocking(move || Built::new(to_index))
                            .await
                            .map(Arc::new)
                            .map_err(|e| e.to_string())
                    };
                    slot.get_or_try_init(init).await.cloned()
                });
                let built = building.await.map_err(|e| e.to_string()).and_then(|b| b);
                drop(interest);
                built
            }
        };
        let index = match built {
            Ok(index) => index,
            Err(e) => {
                // The slot stays empty: the next search builds again.
                tracing::warn!(error = %e, "building the tool search index failed");
                return Vec::new();
            }
        };
        // Ranking is CPU work in proportion to the listing: off the async threads.
        let query: String = query.chars().take(QUERY_CHARS).collect();
        let ranking = index.clone();
        let ranked = tokio::task::spawn_blocking(move || ranking.search(&query, k))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "tool search failed");
                Vec::new()
            });
        // The caller's own tools, by place (the index's listing is this one, in this
        // order); one whose name is not the index's at its place is not given, should
        // a hash have matched another listing.
        ranked
            .into_iter()
            .filter_map(|(i, score)| {
                let tool = tools.get(i)?;
                (index.names.get(i) == Some(&tool.qualified)).then(|| ToolMatch {
                    tool: tool.clone(),
                    score,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_query_and_a_tools_text_cost_at_most_their_distinct_terms() {
        let words: Vec<String> = (0..300).map(|i| format!("word{i}x")).collect();
        let (base, siblings) = Terms::new().query(&words.join(" "));
        assert_eq!(base.len(), QUERY_TERMS);
        assert!(siblings.len() <= QUERY_TERMS);
        let text = "repeat ".repeat(10_000) + "other";
        let embedder: Embedder<u32, Terms> =
            EmbedderBuilder::with_tokenizer_and_fit_to_corpus(Terms::new(), &[text.as_str()])
                .build();
        let embedded = unique(embedder.embed(&text), TOOL_TERMS);
        assert_eq!(embedded.0.len(), 2, "each term once");
    }

    // A hostile server's tools, each with every field full of distinct words: the
    // index holds a bounded text and number of terms of each.
    #[test]
    fn a_tool_full_of_distinct_words_is_indexed_within_its_bounds() {
        let mut n = 0u32;
        let mut words = |chars: usize| {
            let mut text = String::new();
            while text.len() < chars {
                n += 1;
                text.push_str(&format!("w{n:x}q "));
            }
            text
        };
        let props: serde_json::Map<String, Value> = (0..64)
            .map(|_| {
                (
                    words(4096),
                    json!({"type": "string", "description": words(4096)}),
                )
            })
            .collect();
        let hostile = ToolInfo {
            definition: Arc::new(json!({
                "name": "t",
                "description": words(4096),
                "inputSchema": {"type": "object", "properties": props},
            })),
            ..tool("s", "t", "")
        };
        let text = document(&hostile);
        assert!(text.len() <= DOCUMENT_BYTES, "{} bytes", text.len());
        // Titles of four-byte letters at the field's limit: the text is never built
        // larger than the budget and then cut (it would keep the room).
        let wide = "\u{1D538}".repeat(FIELD_CHARS);
        let titled = ToolInfo {
            definition: Arc::new(json!({
                "name": wide, "title": wide, "annotations": {"title": wide},
                "description": wide,
            })),
            ..tool("s", &wide, "")
        };
        let titled = document(&titled);
        assert!(titled.len() <= DOCUMENT_BYTES, "{} bytes", titled.len());
        assert!(
            titled.capacity() <= 2 * DOCUMENT_BYTES,
            "{}",
            titled.capacity()
        );
        let embedder: Embedder<u32, Terms> =
            EmbedderBuilder::with_tokenizer_and_fit_to_corpus(Terms::new(), &[text.as_str()])
                .build();
        let embedded = unique(embedder.embed(&text), TOOL_TERMS);
        assert!(embedded.0.len() <= TOOL_TERMS, "{} terms", embedded.0.len());
        assert!(embedded.0.capacity() <= TOOL_TERMS);
        // A listing's tools share its budget by what they have: small tools leave the
        // rest to large ones, and each keeps a few.
        assert_eq!(tool_terms(&[TOOL_TERMS], LISTING_TERMS), TOOL_TERMS);
        assert_eq!(
            tool_terms(&[40; 1000], LISTING_TERMS),
            TOOL_TERMS,
            "all fit"
        );
        let mixed: Vec<usize> = [vec![40; 1000], vec![TOOL_TERMS; 200]].concat();
        let cap = tool_terms(&mixed, LISTING_TERMS);
        assert_eq!(cap, (LISTING_TERMS - 40 * 1000) / 200);
        let total: usize = mixed.iter().map(|c| (*c).min(cap)).sum();
        assert!(total <= LISTING_TERMS);
        assert_eq!(
            tool_terms(&[TOOL_TERMS; 20_000], LISTING_TERMS),
            MIN_TOOL_TERMS
        );
    }

    /// Distinct words, never the same twice.
    #[derive(Default)]
    struct Words(u32);

    impl Words {
        fn take(&mut self, count: usize) -> String {
            (0..count)
                .map(|_| {
                    self.0 += 1;
                    format!("pad{:x}q", self.0)
                })
                .collect::<Vec<_>>()
                .join(" ")
        }
    }

    fn tool(server: &str, name: &str, description: &str) -> ToolInfo {
        ToolInfo {
            qualified: format!("{server}__{name}").into(),
            name: name.into(),
            server: server.into(),
            definition: Arc::new(json!({
                "name": name,
                "description": description,
                "inputSchema": {"type": "object", "properties": {"path": {"type": "string", "description": "Where"}}}
            })),
            from_cache: false,
        }
    }

    // A server's 17,000 tools (past 16,384), each of 16 words no other has: 8 terms
    // each are indexed. Before, up to 64 each: all 16 and more (of 64 words, 64 each:
    // ten times the listing's budget for 20,000 tools).
    #[test]
    fn a_listing_of_many_wordy_tools_holds_a_few_terms_a_tool() {
        let mut words = Words::default();
        let tools: Vec<ToolInfo> = (0..17_000)
            .map(|i| tool("s", &format!("t{i}"), &words.take(16)))
            .collect();
        let built = Built::new(tools);
        assert!(built.indexed <= 17_000 * 8, "{}", built.indexed);
        // Its name is among them: found by it.
        let found = built.search("t123", 1);
        assert_eq!(built.names[found[0].0].as_ref(), "s__t123");
    }

    #[test]
    fn identifiers_split_into_words() {
        let w: Vec<String> = words("list_allowedDirectories get-file.v2 HTTPServer").collect();
        assert_eq!(
            w,
            [
                "list",
                "allowed",
                "directories",
                "get",
                "file",
                "v2",
                "httpserver"
            ]
        );
    }

    #[tokio::test]
    async fn ranks_by_relevance_and_finds_paraphrases() {
        let tools = vec![
            tool("fs", "move_file", "Move or rename a file or directory"),
            tool("fs", "read_file", "Read the contents of a file"),
            tool("maps", "maps_elevation", "Get the elevation of a location"),
            tool("db", "query", "Run a read-only SQL query"),
        ];
        let index = SearchIndex::default();
        let found = index
            .search(tools.clone(), "read the contents of notes.txt", 2)
            .await;
        assert_eq!(&*found[0].tool.qualified, "fs__read_file");
        let found = index
            .search(tools.clone(), "the altitude of this point", 1)
            .await;
        assert_eq!(&*found[0].tool.qualified, "maps__maps_elevation");
        assert!(index.search(tools.clone(), "zebra", 5).await.is_empty());
        assert!(index.search(tools, "", 5).await.is_empty());
        // Hostile sizes are read only so far.
        let huge = tool("x", "huge", &"word ".repeat(100_000));
        let found = index.search(vec![huge], &"word ".repeat(10_000), 1).await;
        assert_eq!(found.len(), 1);
    }

    #[tokio::test]
    async fn searches_of_a_new_listing_at_once_build_its_index_once() {
        let tools: Vec<ToolInfo> = (0..500)
            .map(|i| tool("s", &format!("tool_{i}"), "Read and write files on disk"))
            .collect();
        let index = SearchIndex::default();
        let search = || index.search(tools.clone(), "write a file", 3);
        let found = tokio::join!(search(), search(), search(), search());
        assert!(
            [found.0, found.1, found.2, found.3]
                .iter()
                .all(|f| f.len() == 3)
        );
        assert_eq!(
            index.builds.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "the others waited for the first build"
        );
        // A listing seen before is not built again.
        index.search(tools, "disk", 1).await;
        assert_eq!(index.builds.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    // A server with thousands of wordy tools cuts its own tools' share of the listing's
    // terms, not another server's: a tool found only by a word late in its text is
    // still found beside them.
    #[tokio::test]
    async fn a_wordy_server_does_not_cut_another_servers_tools_short() {
        let mut words = Words::default();
        let mut tools: Vec<ToolInfo> = (0..2100)
            .map(|i| tool("flood", &format!("t{i}"), &words.take(100)))
            .collect();
        // Past its 64th distinct term: the word it is found by.
        let honest = format!("{} zeppelin", words.take(100));
        tools.push(tool("honest", "fly", &honest));
        let found = SearchIndex::default().search(tools, "zeppelin", 1).await;
        assert_eq!(
            found.first().map(|m| &*m.tool.qualified),
            Some("honest__fly")
        );
    }

    // Servers that need less than an equal share leave the rest to the others: a
    // listing within its budget is not cut, however many servers share it.
    #[tokio::test]
    async fn a_listing_within_its_budget_is_not_cut_however_many_servers_share_it() {
        let mut words = Words::default();
        let mut tools: Vec<ToolInfo> = (0..39)
            .map(|i| tool(&format!("tiny{i}"), "t", "Read a file"))
            .collect();
        for i in 0..89 {
            tools.push(tool("medium", &format!("t{i}"), &words.take(200)));
        }
        tools.push(tool(
            "medium",
            "fly",
            &format!("{} zeppelin", words.take(150)),
        ));
        let found = SearchIndex::default().search(tools, "zeppelin", 1).await;
        assert_eq!(
            found.first().map(|m| &*m.tool.qualified),
            Some("medium__fly")
        );
    }

    // A listing fetched anew for each search (a server whose list is never cached): the
    // same tools at new addresses are the same listing, whose index serves; it does not
    // push the others' indexes out. And an index holds no definition: a listing the
    // cache let go is freed.
    #[tokio::test]
    async fn the_same_tools_fetched_anew_reuse_their_index_and_the_index_holds_none() {
        use std::sync::atomic::Ordering::Relaxed;
        let index = SearchIndex::default();
        let kept: Vec<ToolInfo> = vec![tool("a", "read_file", "Read a file")];
        index.search(kept.clone(), "read", 1).await;
        let fetched = || -> Vec<ToolInfo> {
            (0..50)
                .map(|i| tool("b", &format!("tool_{i}"), "Write files on disk"))
                .collect()
        };
        for _ in 0..KEPT + 2 {
            let found = index.search(fetched(), "write", 3).await;
            assert_eq!(found.len(), 3);
        }
        assert_eq!(
            index.builds.load(Relaxed),
            2,
            "one build per distinct listing"
        );
        index.search(kept, "read", 1).await;
        assert_eq!(
            index.builds.load(Relaxed),
            2,
            "the first listing's index was kept"
        );
        // Different content at the same names is another listing.
        let changed: Vec<ToolInfo> = (0..50)
            .map(|i| tool("b", &format!("tool_{i}"), "Delete files on disk"))
            .collect();
        let found = index.search(changed.clone(), "delete", 1).await;
        assert_eq!(found.len(), 1);
        assert_eq!(index.builds.load(Relaxed), 3);
        // The results are the caller's own tools.
        assert!(
            changed
                .iter()
                .any(|t| Arc::ptr_eq(&t.definition, &found[0].tool.definition))
        );
        let weak = Arc::downgrade(&changed[0].definition);
        drop((changed, found));
        assert!(
            weak.upgrade().is_none(),
            "the index kept a definition alive"
        );
    }

    // A server that writes something new in its list at every listing (never cached,
    // a counter in a description): its listings hold two of the kept indexes, not all
    // of them, and the other listings' indexes serve on without a build.
    #[tokio::test]
    async fn a_listing_that_changes_at_every_search_does_not_push_the_others_out() {
        use std::sync::atomic::Ordering::Relaxed;
        let index = SearchIndex::default();
        let honest: Vec<Vec<ToolInfo>> = (0..KEPT - KEPT_OF_ONE_SHAPE)
            .map(|i| vec![tool(&format!("h{i}"), "read_file", "Read a file")])
            .collect();
        for listing in &honest {
            index.search(listing.clone(), "read", 1).await;
        }
        for n in 0..3 * KEPT {
            let churning = vec![tool("c", "count", &format!("Counted {n} times"))];
            assert_eq!(index.search(churning, "counted", 1).await.len(), 1);
        }
        let built = index.builds.load(Relaxed);
        assert_eq!(built, honest.len() + 3 * KEPT, "each new text is built");
        for listing in &honest {
            assert_eq!(index.search(listing.clone(), "read", 1).await.len(), 1);
        }
        assert_eq!(
            index.builds.load(Relaxed),
            built,
            "the honest listings' indexes were pushed out"
        );
    }

    /// Every turn to build taken, until the permit is dropped: builds wait.
    async fn every_turn(index: &SearchIndex) -> tokio::sync::OwnedSemaphorePermit {
        let turns = index.building.clone();
        let all = turns.acquire_many_owned(BUILDS_AT_ONCE as u32).await;
        all.expect("turns")
    }

    // A search that waits for its index's build past its deadline (every build's turn
    // taken by others) is given up then. Before, it waited for the builds before it.
    #[tokio::test]
    async fn a_search_waiting_for_its_build_is_given_up_at_its_deadline() {
        use std::time::Duration;
        let index = SearchIndex::default();
        let turns = every_turn(&index).await;
        let tools = vec![tool("s", "read_file", "Read files")];
        let until = tokio::time::Instant::now() + Duration::from_millis(200);
        let found = tokio::time::timeout(
            Duration::from_secs(20),
            index.search_until(tools.clone(), "read", 1, until),
        )
        .await
        .expect("given up at its deadline");
        assert!(found.is_none());
        drop(turns);
        // The build went on: the next search is served.
        let until = tokio::time::Instant::now() + Duration::from_secs(20);
        let found = index.search_until(tools, "read", 1, until).await;
        assert_eq!(found.map(|f| f.len()), Some(1));
        let builds = index.builds.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(builds, 1, "the first search's build, not one of its own");
    }

    // A search given up while its index is being built (its client gone) leaves the
    // build to finish: the next search finds it. Before, the build was thrown away and
    // each search that came and went started one more.
    #[tokio::test]
    async fn a_build_no_longer_kept_nor_awaited_is_not_made_when_its_turn_comes() {
        use std::sync::atomic::Ordering::Relaxed;
        let index = Arc::new(SearchIndex::default());
        // Every turn taken: builds wait.
        let turns = every_turn(&index).await;
        let search = |n: usize| {
            let (index, tools) = (
                index.clone(),
                vec![tool("s", &format!("t{n}"), "Read files")],
            );
            tokio::spawn(async move { index.search(tools, "read", 1).await })
        };
        let listed = || index.built.lock().len();
        let first = search(0);
        while listed() < 1 {
            tokio::task::yield_now().await;
        }
        let first_slot = Arc::downgrade(&index.built.lock()[0].slot);
        // Its search is given up, and eight other listings are searched since.
        first.abort();
        assert!(first.await.is_err_and(|e| e.is_cancelled()));
        let others: Vec<_> = (1..=KEPT).map(search).collect();
        // Until every other one waits for its turn and the first is no longer kept.
        while index.built.lock().iter().any(|l| {
            Arc::strong_count(&l.slot) < 2
                || std::ptr::eq(Arc::as_ptr(&l.slot), first_slot.as_ptr())
        }) || listed() < KEPT
        {
            tokio::task::yield_now().await;
        }
        drop(turns);
        for other in others {
            assert_eq!(other.await.expect("search").len(), 1);
        }
        // The first build had the first turn: by now it was made or skipped.
        assert_eq!(index.builds.load(Relaxed), KEPT);
    }

    #[tokio::test]
    async fn a_search_given_up_during_its_build_leaves_the_build_to_the_next() {
        let tools: Vec<ToolInfo> = (0..2000)
            .map(|i| tool("s", &format!("tool_{i}"), "Read and write files on disk"))
            .collect();
        let index = SearchIndex::default();
        for _ in 0..3 {
            let search = index.search(tools.clone(), "write a file", 3);
            // Given up as soon as it has begun.
            let _ = tokio::time::timeout(std::time::Duration::from_micros(1), search).await;
        }
        assert_eq!(index.search(tools, "disk", 1).await.len(), 1);
        assert_eq!(index.builds.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
