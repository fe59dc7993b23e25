// The generation engine: the scheduler and the one generation loop. It runs model steps over many
// sequences through a ModelBackend. The server runs it on its own thread (start()); HTTP threads
// only submit Jobs and read their events through a per-job queue. The CLI runs it on the caller's
// thread (generate()), one job at a time, as nano-vllm's LLMEngine.generate serves offline use.
//
// Each step (continuous batching with chunked prefill):
//   1. new jobs join the FIFO queue; cancelled jobs (client gone) leave it, or leave their slot;
//   2. queued jobs are admitted in order while a slot is free: the slot is the one that already
//      holds the longest prefix of the prompt (prefix reuse: a free slot is taken as it is, a busy
//      slot whose tokens are a prefix is copied with copy_slot), else the least recently used;
//      shared prefixes: a prompt that shares at least kMinShared tokens more with some slot's tokens
//      than that prefix reuse gives (two requests with one system prompt and different questions)
//      pauses its prefill where the shared part ends, and the engine copies its slot there into
//      the least recently used free slot: a snapshot, which later prompts starting with those tokens
//      copy (a snapshot is used in place only when it is the last free slot). The state a slot
//      holds after n tokens is the same however they were chunked (the backends' invariance), so a
//      request that starts from a snapshot gets the logits it would get from an empty slot;
//      in flight: prompts admitted together (one system prompt, many requests at once) compute the
//      shared part once: a later one waits while an earlier one computes it and pauses there for a
//      snapshot, then copies that state (share_in_flight, waits_for_shared);
//   3. the batch is every decoding sequence's next token, then prefill chunks of admitted prompts
//      in admission order until max_step_tokens are used;
//   4. rows with logits are sampled with the job's own RowSampler (its seed, penalties over prompt +
//      output, EOS banned before min_tokens), and the job's StopRule (runtime/stop_rule.h)
//      detokenizes, holds back stop strings and says whether the job ends; events go to its queue.
// With MTP (EngineOptions::mtp_draft = K, speculative decoding): before the batch is built, every
// decoding sequence without a grammar gets up to K drafts from the model's MTP block
// (ModelBackend::draft, drawn with the job's own seed at the counters of the tokens they propose);
// its step feeds its next token and the drafts as one undoable run with logits on every row. Row j is
// then sampled exactly as a plain decode step would (the job's sampler, penalties over the tokens so
// far, the same counter); draft j+1 is accepted while it equals the token drawn from row j, and the
// slot is rolled back past the first mismatch (ModelBackend::rollback_slot). Every emitted token is
// one the same job would draw without MTP, bit for bit on an exact backend: MTP changes only how many
// tokens a step yields. Drafts are capped by the step budget, the context, max_tokens and the undo
// limit; MTP steps sample on the host.
// A job ends on EOS, a stop id or string, max_tokens, the context limit or cancellation; its slot
// is free for the next step and keeps its tokens for later prefix reuse.
//
// Sequences sharing a prompt (a request's n / best_of choices) prefill it once: the first job
// (JobSpec::forks > 0) stops its prefill one token short of the prompt's end for one step; the
// others (JobSpec::fork_of = the first) wait at the queue's head until then, and are admitted by
// the prefix reuse above: each copies the first job's slot (copy_slot) and feeds only the prompt's
// last token itself, whose logits it samples from with its own seed. A copy needs a free slot at
// that step: choices beyond the free slots queue and prefill on their own later (no deadlock).
// A job with prompt_logprobs (echo + logprobs) asks for every prompt row's logits (at most
// kPromptRows such rows a step) and takes no prefix reuse, so every position is computed.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "seam/backend.h"
#include "runtime/engine_metrics.h"
#include "runtime/token_constraint.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace cm::runtime {

struct TopLogprob {
  int32_t id;
  float logprob;
};

class Job;

struct TokenOut {
  int32_t id;
  float logprob = 0;              // raw model distribution (before penalties and temperature)
  std::vector<TopLogprob> top;    // the job's logprobs most likely tokens
};

// What a job sends back. Token events carry the text released with that token (may be empty
// while a stop string or an incomplete UTF-8 character is held back); the last event is Finish.
struct JobEvent {
  enum Kind { Token, Finish } kind = Token;
  std::string text;
  std::vector<TokenOut> tokens;   // Token: the token(s) this text came with
  // The first Token event of a prompt_logprobs job: every prompt token with its raw logprob given
  // the tokens before it; the first one has none (logprob NaN, no alternatives), as OpenAI's null.
  std::vector<TokenOut> prompt_logprobs;
  // Finish:
  std::string finish_reason;      // "stop", "length", "cancelled", "error"
  bool eos = false;               // ended by an EOS token (not emitted as text)
  std::string error;              // finish_reason "error": what went wrong
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

struct JobSpec {
  std::string id;                  // for the log line
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // end the job like EOS (not output as text)
  bool ignore_eos = false;
  int64_t min_tokens = 0;          // EOS and stop ids are not sampled before this many tokens
  int logprobs = -1;               // -1 off, else top alternatives per token
  // A cancelled job's Finish event still carries the text held back (an incomplete UTF-8
  // character as U+FFFD, a possible stop-string start): the CLI's chat keeps an answer stopped with
  // Ctrl-C, to the last byte, in its history. A server's client is gone when its job is cancelled.
  bool release_held_on_cancel = false;
  // Choices of one prompt (see the header comment): `forks` later jobs copy this job's prompt
  // state; `fork_of` is the job whose prompt state this one copies (same prompt).
  int forks = 0;
  std::shared_ptr<Job> fork_of;
  bool prompt_logprobs = false;    // logprobs (with `logprobs` alternatives) of every prompt token
  // Structured output (runtime/grammar_gate.h's JobGrammar): tokens outside the grammar are never
  // sampled; the job ends "stop" once the grammar is complete and an EOS id is sampled. Null: free.
  std::shared_ptr<const TokenConstraintFactory> constraint;
};

// One request as the engine sees it. The HTTP thread keeps a shared_ptr, sets `cancelled` when
// its client is gone, and pops events; the engine pushes them.
class Job {
 public:
  explicit Job(JobSpec s) : spec(std::move(s)) {}
  const JobSpec spec;
  const std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
  std::atomic<bool> cancelled{false};

  void push(JobEvent e);
  // Waits up to timeout_ms for events; returns those available (empty on timeout).
  std::vector<JobEvent> pop(int timeout_ms);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobEvent> events_;
};

struct EngineOptions {
  int32_t max_seqs = 8;
  int32_t max_step_tokens = 512;
  int64_t ctx = 4096;
  std::vector<int32_t> eos_ids;    // ids that end a sequence (config, tokenizer, generation_config)
  // Sample where the logits are (ModelBackend::sample_last_step: the host neither copies nor scans
  // rows x vocab floats) in the steps whose every logits row is a token to draw for a job without
  // logprobs or a grammar; the others return their logits as before. The same tokens either way.
  bool sample_on_device = true;
  // Speculative decoding with the model's MTP block: drafts per decoding sequence and step, in
  // [0, kMaxDraft] (0: off). The backend must run the block (ModelBackend::has_mtp()).
  int32_t mtp_draft = 0;
  // Prefix caching (vLLM's --enable-prefix-caching): prompts start from a slot that holds their longest
  // prefix, and shared prefixes are kept as snapshots (see the header comment). false: every prompt
  // starts from an empty slot.
  bool prefix_caching = true;
  // Called by the engine thread after an iteration that found nothing to do (at least every 50 ms
  // while idle): a server over many ranks passes its LeaderBackend's keepalive here.
  std::function<void()> on_idle;
};

// What MTP speculation did so far (vLLM's spec_decode counters).
struct SpecStats {
  int64_t rounds = 0;    // verify runs (a sequence's next token and its drafts in one step)
  int64_t drafted = 0;   // draft tokens proposed
  int64_t accepted = 0;  // of which accepted
  int64_t accepted_at[kMaxDraft] = {};  // accepted drafts by their index in the round
  int64_t steps = 0;     // engine steps run (with or without speculation)
  int64_t emitted = 0;   // tokens emitted by those steps' sampled rows
};

class Engine {
 public:
  // The backend is reserved for (max_seqs, max_step_tokens, ctx) unless it already is; every slot
  // starts empty. vocab: logits row width. tok may be null (token ids only: events carry no text).
  Engine(ModelBackend& backend, const Tokenizer* tok, int64_t vocab, EngineOptions opt, EngineMetrics* metrics);
  ~Engine();

  void submit(std::shared_ptr<Job> job);  // thread-safe
  // Several jobs at once, in order (a request's choices: its forks are queued with their source).
  void submit(std::vector<std::shared_ptr<Job>> jobs);
  void start();                           // the engine thread
  void stop();                            // stops after the current step; unfinished jobs end "cancelled"
  // Runs one scheduler iteration on the caller's thread (tests; only without start()).
  // Returns false when there was nothing to do.
  bool step_once();
  bool idle() const;  // nothing queued, nothing running
  // Runs one job to its end on the caller's thread (only without start()), handing each event to
  // on_event as it is made; the Finish event is returned too. A set `cancel` ends it "cancelled".
  JobEvent generate(JobSpec spec, const std::function<void(const JobEvent&)>& on_event,
                    const std::atomic<bool>* cancel = nullptr);
  // Forgets what every free slot holds, so the next job starts from an empty state (the CLI's
  // chat /reset).
  void drop_cached_prefixes();
  int64_t slot_count() const { return int64_t(slots_.size()); }
  const SpecStats& spec_stats() const { return spec_; }  // engine thread (or after stop())

 private:
  struct Seq;
  struct Slot {
    bool busy = false;
    std::vector<int32_t> held;  // tokens the slot's state has consumed
    uint64_t last_used = 0;
    bool snapshot = false;      // a free slot kept as a shared prefix (copied, not taken, while others are free)
  };
  // Snapshots are made for shared parts of at least this many tokens beyond the reusable prefix.
  static constexpr int64_t kMinShared = 32;
  void run();
  void take_incoming();
  void drop_cancelled();
  void admit();
  int32_t choose_slot(const std::vector<int32_t>& prompt, int64_t* reused);
  bool waits_for_fork(const Job& j) const;
  // The most tokens the prompt shares with any slot's tokens (prefix caching's snapshot point).
  int64_t shared_prefix(const std::vector<int32_t>& prompt) const;
  // Copies s's slot (holding s.fed prompt tokens) into the least recently used free slot as a snapshot.
  void snapshot(Seq& s);
  // In-flight sharing: when s's prompt shares at least kMinShared tokens beyond s.fed with a prompt
  // admitted before it that has not computed them yet, s waits for it (Seq::wait_job) and that one
  // pauses there for a snapshot. Called at admission.
  void share_in_flight(Seq& s);
  // Whether s still waits; once not (wait_job cleared, once), it copies the longest slot state that is a
  // prefix of its prompt (and at least kMinShared tokens beyond s.fed) into its own slot.
  bool waits_for_shared(Seq& s);
  // The least recently used free slot other than `except` (-1: none).
  int32_t lru_free(int32_t except) const;
  // Returns false when the token ended the job (the Seq is gone).
  bool on_logits(Seq& s, const float* row);
  // MTP: the drafts of this step's speculating sequences (Seq::drafts); jobs whose drafts fail end.
  void make_drafts();
  // MTP: samples a speculating sequence's k + 1 rows (their logits; or, null, the tokens and logprobs the
  // backend drew for them), accepts the drafts that match, rolls its slot back.
  void verify(Seq& s, const float* rows, const int32_t* tokens = nullptr, const TokenOut* lps = nullptr);
  // The job's next token id is drawn (row: its logits, or null when they stayed on the device).
  // row: the raw logits the token came from (its logprobs are computed from them), or null; lp: the
  // token's logprobs when the backend computed them (device sampling), or null.
  // Returns false when the token ended the job (the Seq is gone).
  bool on_token(Seq& s, int32_t id, const float* row, const TokenOut* lp = nullptr);
  // The step's sampling arrays for the backend (a row per logits row, in order); false when they
  // exceed what a backend takes (ModelBackend::kMaxSampleAdjust): the step then returns its logits.
  bool build_device_sampling(const std::vector<Seq*>& seqs);
  // Draws the step's rows on the backend; false (nothing drawn) when it failed, having ended the jobs.
  bool sample_rows_on_device(const std::vector<Seq*>& seqs);
  void on_prompt_row(Seq& s, int64_t pos, const float* row);
  void finish(Seq& s, const std::string& reason, bool eos, const std::string& error = "");

  ModelBackend& be_;
  const Tokenizer* tok_;
  int64_t vocab_;
  EngineOptions opt_;
  EngineMetrics* metrics_;

  std::mutex in_mu_;
  std::condition_variable in_cv_;
  std::deque<std::shared_ptr<Job>> incoming_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> n_running_{0}, n_waiting_{0}, n_incoming_{0};
  std::thread thread_;

  // Engine-thread state.
  std::deque<std::shared_ptr<Job>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;  // in admission order
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
  std::vector<int32_t> b_token_, b_pos_, b_slot_;
  std::vector<uint8_t> b_logits_, b_undo_;
  SpecStats spec_;
  std::vector<float> logits_;
  // sample_rows_on_device's arrays (kept: a step allocates only when a row needs more room).
  std::vector<SampleParams> d_params_;
  std::vector<SampleAdjust> d_adj_;
  std::vector<int64_t> d_offsets_;
  std::vector<uint32_t> d_mask_;
  std::vector<int32_t> d_token_;
  std::vector<float> d_logprob_;
  int32_t d_top_n_ = 0;  // the step's top logprobs per row (the largest any of its jobs asks)
  std::vector<int32_t> d_top_id_;
  std::vector<float> d_top_lp_;
  static constexpr int32_t kPromptRows = 64;  // prompt_logprobs rows a step may ask for
};

}  // namespace cm::runtime
