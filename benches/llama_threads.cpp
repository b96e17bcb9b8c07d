// Decode throughput of llama.cpp with a given thread count, for comparing its two CPU
// threading builds (ggml's own thread pool vs OpenMP) on the same model and the same shapes
// as synth's `local` provider: PARALLEL sequences, each in its own KV stream, a short prompt
// each, then STEPS generation steps of one token per sequence (greedy, argmax of the logits).
// Built and run by benches/llama_threads.sh, which links it once against each build of ggml.
//   llama_threads MODEL PARALLEL STEPS THREADS
#include "llama.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static void quiet(ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s MODEL PARALLEL STEPS THREADS\n", argv[0]);
        return 2;
    }
    const char * path = argv[1];
    const int parallel = std::atoi(argv[2]);
    const int steps = std::atoi(argv[3]);
    const int threads = std::atoi(argv[4]);
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) {
        std::fprintf(stderr, "cannot load %s\n", path);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512 * parallel;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_seq_max = parallel;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.kv_unified = false;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        std::fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    const std::string prompt = "<|im_start|>user\nWrite a short story about a lighthouse.<|im_end|>\n<|im_start|>assistant\n";
    std::vector<llama_token> tokens(256);
    const int n = llama_tokenize(vocab, prompt.c_str(), (int) prompt.size(), tokens.data(), (int) tokens.size(), true, true);
    tokens.resize(n);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    llama_batch batch = llama_batch_init(512, 0, 1);
    std::vector<llama_token> last(parallel);
    std::vector<int> pos(parallel);
    auto argmax = [&](int row) {
        const float * logits = llama_get_logits_ith(ctx, row);
        int best = 0;
        for (int t = 1; t < n_vocab; t++) {
            if (logits[t] > logits[best]) best = t;
        }
        return (llama_token) best;
    };
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < parallel; s++) {
        batch.n_tokens = 0;
        for (int i = 0; i < n; i++) {
            batch.token[i] = tokens[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = s;
            batch.logits[i] = i == n - 1;
            batch.n_tokens++;
        }
        if (llama_decode(ctx, batch) != 0) return 1;
        last[s] = argmax(n - 1);
        pos[s] = n;
    }
    const auto t1 = std::chrono::steady_clock::now();
    for (int step = 0; step < steps; step++) {
        batch.n_tokens = 0;
        for (int s = 0; s < parallel; s++) {
            const int i = batch.n_tokens++;
            batch.token[i] = last[s];
            batch.pos[i] = pos[s]++;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = s;
            batch.logits[i] = true;
        }
        if (llama_decode(ctx, batch) != 0) return 1;
        for (int s = 0; s < parallel; s++) last[s] = argmax(s);
    }
    const auto t2 = std::chrono::steady_clock::now();
    const double prefill = std::chrono::duration<double>(t1 - t0).count();
    const double gen = std::chrono::duration<double>(t2 - t1).count();
    std::printf("parallel %d threads %d: prompt %d x %d tokens %.2f s (%.1f tokens/s), generation %d x %d tokens %.2f s (%.1f tokens/s)\n",
                parallel, threads, parallel, n, prefill, parallel * n / prefill, steps, parallel, gen, steps * parallel / gen);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
