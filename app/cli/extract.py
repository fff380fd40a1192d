"""``crowdtally extract``: the seed's nominalonlineextract on a file (no service, no web stack)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer

from app.cli.collector import without_cycle_collection
from app.cli.layout import STDOUT, as_typed, check_output, class_names
from app.io.input import InputError, refuse_duplicate_columns
from core.nominal import MAX_FIRST_STEP, LaterPasses, NominalConfig, first_step

if TYPE_CHECKING:  # (core.blocks loads numba: a command starts without it)
    from core.blocks import IntArray

DEFAULTS = NominalConfig(n_classes=2)

# Every spelling of the options whose values are checked here (errors name the one typed).
N_LABELS = ("--n-labels", "--n_labels")
N_WORKER_SLOTS = ("--n-worker-slots", "--n_worker_slots", "--n_workers")
INITIAL_T = ("--initial-t", "--initial_t")
N_ITEMS = ("--n-items", "--n_items")
TEST_ONLY = ("--test-only", "--test_only")


def _priorz(text: str, flag: str, n_classes: int) -> tuple[float, ...]:
    """``--priorz``: one positive weight per class (normalised by the model)."""
    try:
        weights = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise InputError(flag, None, f"expected comma-separated numbers, got {text!r}") from None
    if len(weights) != n_classes or not all(np.isfinite(w) and w > 0 for w in weights):
        raise InputError(
            flag, None, f"needs {n_classes} positive numbers, one per class, got {text!r}"
        )
    if not np.isfinite(sum(weights)):  # (normalised by their sum)
        raise InputError(flag, None, f"the numbers' sum overflows, got {text!r}")
    return weights


def _check(value: float, flag: str, minimum: float, strict: bool = False) -> None:
    """A hyperparameter flag's value: finite and >= minimum (> when ``strict``)."""
    if not np.isfinite(value) or value < minimum or (strict and value == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise InputError(flag, None, f"must be a finite number {bound}, got {value:g}")


@without_cycle_collection
def extract(
    ctx: typer.Context,
    data: Annotated[
        Path | None,
        typer.Argument(
            metavar="DATA",
            help="Answers file: item,worker,label[,weight] rows, CSV, tab/space separated or "
            "Parquet.",
        ),
    ] = None,
    data_opt: Annotated[
        Path | None,
        typer.Option("--data", metavar="FILE", help="Same as the DATA argument (the seed's flag)."),
    ] = None,
    labels: Annotated[
        str | None,
        typer.Option("--labels", metavar="A,B,...", help="Class names in order, comma-separated."),
    ] = None,
    n_labels: Annotated[
        int | None,
        typer.Option(
            *N_LABELS,
            metavar="K",
            help="K classes: labels 0..K-1 are class indices; other labels (e.g. G,P,R,X) "
            "must be K distinct values, taken in sorted order (numbers numerically).",
        ),
    ] = None,
    n_worker_slots: Annotated[
        int, typer.Option(*N_WORKER_SLOTS, metavar="N", help="Hashed worker slots.")
    ] = DEFAULTS.n_worker_slots,
    eta: Annotated[
        float, typer.Option("--eta", help="eta_0 of eta_t = eta_0 (tau_0 + t)^-rho.")
    ] = DEFAULTS.eta0,
    rho: Annotated[float, typer.Option("--rho", help="Decay exponent rho.")] = DEFAULTS.rho,
    initial_t: Annotated[float, typer.Option(*INITIAL_T, help="tau_0.")] = DEFAULTS.tau0,
    n_items: Annotated[
        float | None,
        typer.Option(
            *N_ITEMS,
            help="|I|, the prior's weight is 1/|I| per item [default: items in the file].",
        ),
    ] = None,
    priorz: Annotated[
        str | None,
        typer.Option(
            "--priorz",
            metavar="P1,P2,...",
            help="Prior class distribution, one positive weight per class in the classes' "
            "order, comma-separated (normalised).",
        ),
    ] = None,
    passes: Annotated[int, typer.Option("--passes", min=1, help="Passes over the items.")] = 1,
    later_passes: Annotated[
        LaterPasses,
        typer.Option(
            "--later-passes",
            help="Passes 2..N: revisit items one by one (progressive-validation table) or "
            "sweep by trust-region Newton toward batch EM's optimum (docs/model.md eq. 17-20).",
        ),
    ] = LaterPasses.revisit,
    shuffle: Annotated[
        int | None,
        typer.Option(
            "--shuffle",
            metavar="SEED",
            help="Process items in a random order drawn from this seed, anew each pass "
            "[default: file order].",
        ),
    ] = None,
    difficulty: Annotated[
        bool, typer.Option("--difficulty/--no-difficulty", help="Model a per-item clarity.")
    ] = DEFAULTS.difficulty,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model", "--save", metavar="FILE", help="Write the final model to this file."
        ),
    ] = None,
    load: Annotated[
        Path | None,
        typer.Option(
            "--load", metavar="FILE", help="Start from this saved model (its configuration wins)."
        ),
    ] = None,
    test_only: Annotated[
        bool,
        typer.Option(*TEST_ONLY, help="Do not learn: posteriors under the loaded model."),
    ] = False,
    predictions: Annotated[
        Path | None,
        typer.Option(
            "--predictions",
            "--output",
            "-o",
            metavar="FILE",
            help="Write item,label,probability,<one column per class> (CSV, or Parquet for a "
            ".parquet name); '-': as CSV to standard output (the report then goes to standard "
            "error).",
        ),
    ] = None,
    truth: Annotated[
        Path | None,
        typer.Option(
            "--truth", metavar="FILE", help="Gold labels (item,label) to report accuracy."
        ),
    ] = None,
    batch: Annotated[
        bool, typer.Option("--batch", help="Batch EM to convergence instead of online EM.")
    ] = False,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Report and write the model's own posteriors instead of the calibrated ones "
            "the service serves (docs/model.md eq. 21-23).",
        ),
    ] = False,
) -> None:
    """Aggregate labels: posteriors per item and worker confusion matrices (nominalonlineextract)."""
    path = data or data_opt
    if path is None or (data is not None and data_opt is not None):
        raise InputError("DATA", None, "give the answers file once, as an argument or with --data")
    test_only_flag, n_labels_flag = as_typed(ctx, *TEST_ONLY), as_typed(ctx, *N_LABELS)
    if test_only and load is None:
        raise InputError(test_only_flag, None, "needs a model to test: give --load FILE")
    if test_only and batch:
        raise InputError(test_only_flag, None, "cannot be combined with --batch")
    if load is not None and batch:  # (batch EM fits from its own start: the model was unused)
        raise InputError("--load", None, "applies to online EM only; --batch fits from scratch")
    if batch and (passes != 1 or shuffle is not None or later_passes is not LaterPasses.revisit):
        flag = (
            "--passes" if passes != 1 else "--shuffle" if shuffle is not None else "--later-passes"
        )
        raise InputError(
            flag, None, "applies to online EM only; --batch runs batch EM to convergence"
        )
    if later_passes is LaterPasses.newton and test_only:
        raise InputError(
            "--later-passes", None, f"newton learns: it cannot be used with {test_only_flag}"
        )
    if test_only and passes != 1:  # (each pass scored the same items again, to the same end)
        raise InputError(
            "--passes", None, f"{passes}, but {test_only_flag} learns nothing: it scores each "
            "item once (one pass)",
        )  # fmt: skip
    _check(eta, "--eta", 0.0)
    _check(rho, "--rho", 0.0)
    _check(initial_t, as_typed(ctx, *INITIAL_T), 0.0)
    first = first_step(eta, initial_t, rho)
    if not first <= MAX_FIRST_STEP:
        raise InputError(
            "--eta", None, f"{eta:g} with {as_typed(ctx, *INITIAL_T)} {initial_t:g} and --rho "
            f"{rho:g} is a first step of {first:g}: at most {MAX_FIRST_STEP:g}",
        )  # fmt: skip
    if n_items is not None:
        _check(n_items, as_typed(ctx, *N_ITEMS), 0.0, strict=True)
    if n_worker_slots < 1:
        raise InputError(
            as_typed(ctx, *N_WORKER_SLOTS), None, f"must be at least 1, got {n_worker_slots}"
        )
    if shuffle is not None and shuffle < 0:
        raise InputError("--shuffle", None, f"the seed must be >= 0, got {shuffle}")
    names = class_names("--labels", labels) if labels is not None else None
    given_in = (("DATA", path), ("--truth", truth), ("--load", load))
    read = [(flag, p) for flag, p in given_in if p is not None]
    for flag, given in read:
        if given.is_dir():
            raise InputError(flag, None, f"{given} is a folder, not a file")
    to_stdout = predictions == STDOUT
    if predictions is not None and not to_stdout:
        predictions = check_output("--predictions", predictions, [p for _, p in read])
    if model is not None:
        why = " (a model is a binary .npz file)"
        model = check_output("--model", model, [p for _, p in read], why)
    if predictions is not None and model is not None and predictions.resolve() == model.resolve():
        raise InputError("--model", None, f"{model} is the --predictions file too: give two files")
    out = sys.stderr if to_stdout else sys.stdout  # (the report: standard output holds the CSV)
    # The file readers (pyarrow) load here, not with the command line: serve and engine skip them.
    from app.io import extract as job
    from app.io.codes import (
        MAP_FROM_ANSWERS,
        read_codes,
        release_unused_memory,
        use_system_allocator,
    )
    from app.io.model_file import SavedModel, load_model, save_model
    from app.io.predictions_file import COLUMNS, print_predictions, write_predictions
    from app.io.triples import truth_rows

    use_system_allocator()
    answers = read_codes(path)
    saved = load_model(load) if load is not None else None
    if saved is not None:
        if n_labels is not None and n_labels != len(saved.classes):
            raise InputError(
                n_labels_flag, None, f"{n_labels}, but {load} has {len(saved.classes)} classes"
            )
        if names is not None and names != list(saved.classes):  # (they were ignored)
            raise InputError(
                "--labels", None, f"{','.join(names)}, but {load} has {','.join(saved.classes)}"
            )
        names, n_labels = list(saved.classes), None
    classes = job.resolve_classes(
        answers.label_names.to_pylist(), names, n_labels, str(path), n_labels_flag=n_labels_flag
    )
    if predictions is not None and predictions.suffix.lower() == ".parquet":
        refuse_duplicate_columns("--predictions", classes, COLUMNS, "write a .csv file")
    encoded = job.encode(answers, classes, str(path))
    del answers
    n_answers = len(encoded.labels)
    release_unused_memory(from_now_on=n_answers >= MAP_FROM_ANSWERS)  # (the file is read)
    gold = None
    if truth is not None:
        rows = truth_rows(truth)
        gold = job.truth_codes(rows, encoded, str(truth))
        if warning := job.unanswered_gold_warning(rows, gold):
            print(warning, file=sys.stderr)
    if saved is not None:
        config = saved.config
    else:
        config = NominalConfig(
            n_classes=len(classes),
            n_worker_slots=n_worker_slots,
            class_prior=_priorz(priorz, "--priorz", len(classes)) if priorz else None,
            eta0=eta,
            tau0=initial_t,
            rho=rho,
            n_items=n_items if n_items is not None else float(encoded.n_items),
            difficulty=difficulty,
        )
    if later_passes is LaterPasses.newton and config.difficulty:
        raise InputError("--later-passes", None, "newton needs a model without difficulty")
    print(_settings_line(config, path, passes, test_only, batch, classes), file=out)
    calibrated = None  # the calibration of the posteriors reported (none with --raw)
    used: IntArray | None  # the slots whose rows the model holds (None: every slot)
    if batch:
        if (warning := job.one_answer_warning(encoded)) is not None:
            print(warning, file=sys.stderr)
        blocks, n_workers = job.exact_blocks(encoded), encoded.n_workers
        encoded = encoded.names()  # (the answers live on as the blocks only)
        fit = job.run_batch(blocks, n_workers, config, out, one_pass=not raw)
        slot_params, used = job.slot_params_from_batch(
            fit.params, blocks, encoded.worker_names, config
        )
        speed = f"batch EM: {fit.result.n_iter} iterations in {fit.seconds:.2f}s"
        if raw:
            posteriors = fit.result.probas
        else:  # a saved model keeps the evidence, so --test-only serves the same posteriors
            slot_params.evidence, one_pass = fit.one_pass(config)
            held = fit.held_out()
            posteriors, calibrated = job.served(held, blocks, slot_params.evidence, out=held)
            speed += f"; {fit.agreement_line(one_pass, posteriors)}"
        del fit, blocks  # (the answers and the fit's arrays, before the predictions are written)
    else:
        used, blocks = job.online_blocks(
            encoded, config, saved.params if saved else None, saved.slots if saved else None
        )
        encoded = encoded.names()  # (the answers live on as the blocks only)
        run = job.run_online(
            blocks,
            used,
            classes,
            config,
            saved.params if saved else None,
            passes,
            shuffle,
            gold,
            test_only,
            out,
            later_passes,
            saved.slots if saved else None,
        )
        refined = passes > 1 and not test_only
        config = config.with_(worker_prior=run.model.config.worker_prior)  # (eq. 29's choice)
        posteriors, calibrated = (
            (run.final.posteriors, None) if raw else run.served(refined, reuse=True)
        )
        slot_params, used = run.model.params, run.used  # (the rows of the slots in use)
        rate = n_answers * passes / run.seconds if run.seconds > 0 else float("inf")
        what = "labels scored (--test-only: none learned)" if test_only else "labels"
        speed = (
            f"online EM: {n_answers * passes} {what} in {run.seconds:.2f}s ({rate:,.0f} labels/s)"
        )
        del run, blocks  # (the answers and the pass's arrays, before the predictions are written)
    print(
        f"{encoded.n_items} items, {n_answers} labels, {len(classes)} classes; {job.collision_line(encoded, config.n_worker_slots)}",
        file=out,
    )
    print(speed, file=out)
    if calibrated is not None:
        print(job.calibration_line(calibrated), file=out)
    if gold is not None:
        print(job.gold_report(posteriors, gold, raw), file=out)
    if to_stdout:
        sys.stdout.flush()
        print_predictions(sys.stdout.buffer, encoded.item_names, classes, posteriors)
    elif predictions is not None:
        write_predictions(predictions, encoded.item_names, classes, posteriors)
        print(f"predictions written to {predictions}", file=out)
    if model is not None:
        save_model(model, SavedModel(config=config, params=slot_params, classes=classes), used)
        print(f"model written to {model}", file=out)


def _settings_line(
    config: NominalConfig,
    path: Path,
    passes: int,
    test_only: bool,
    batch: bool,
    classes: tuple[str, ...],
) -> str:
    prior = ",".join(f"{p:.6f}" for p in np.exp(config.class_prior_logits()))
    mode = "batch EM" if batch else f"online EM, {passes} pass(es)"
    return (
        f"data = {path}  mode = {mode}  initial_t = {config.tau0:g}  eta = {config.eta0:g}  "
        f"rho = {config.rho:g}  n_items = {config.n_items:g}  n_labels = {config.n_classes}  "
        f"n_worker_slots = {config.n_worker_slots}  difficulty = {config.difficulty}  "
        f"test_only = {test_only}  priorz = {prior}  labels = {','.join(classes)}"
    )
