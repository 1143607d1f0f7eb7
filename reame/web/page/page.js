() => {
    // The page's own behaviour, run once when it loads (reame/web/page/parts.py, PAGE_JS).
    // Buttons rendered by the server (the chat list, a message's tools) carry a
    // data-reame-action; it reaches the server through the hidden action button.
    const $ = (selector, root = document) => root.querySelector(selector);
    const send = (action) => {
        window.reameAction = action;
        $("#reame-action-btn").click();
    };

    const renameInline = (button) => {
        const row = button.closest(".reame-row");
        // The input takes the row's button's place, not its title's: inside a button, a
        // space typed would click it (open the chat, and the rest would go to the message).
        const title = $(".reame-open", row);
        const id = button.dataset.reameAction.split(":")[1];
        const input = document.createElement("input");
        input.className = "reame-rename";
        input.value = button.dataset.title;
        input.setAttribute("aria-label", "New title");
        input.maxLength = 200;
        title.replaceWith(input);
        $("details", row)?.removeAttribute("open");
        input.focus();
        input.select();
        let done = false;
        const finish = (save) => {
            if (done) return;
            done = true;
            if (save && input.value.trim() && input.value !== button.dataset.title) {
                send(`rename:${id}:${input.value}`);
            } else {
                input.replaceWith(title);
                title.focus();
            }
        };
        input.addEventListener("keydown", (event) => {
            event.stopPropagation();  // not a list or page shortcut
            if (event.key === "Enter") { event.preventDefault(); finish(true); }
            if (event.key === "Escape") { event.preventDefault(); finish(false); }
        });
        input.addEventListener("click", (event) => event.stopPropagation());
        input.addEventListener("blur", () => finish(true));
    };

    // The action of a button: its data-reame-action (the chat list), or, inside a message
    // (whose markup the Chatbot's sanitizer cuts down to classes), its reame-act-KIND-ID.
    const actionOf = (button) => {
        if (button.dataset.reameAction) return button.dataset.reameAction;
        const match = button.className.match(/\breame-act-([a-z]+)-(\d+)\b/);
        return match ? `${match[1]}:${match[2]}` : null;
    };
    document.addEventListener("click", (event) => {
        for (const menu of document.querySelectorAll("#chat-list details[open]")) {
            if (!menu.contains(event.target)) menu.removeAttribute("open");
        }
        const button = event.target.closest(
            "#chat-list [data-reame-action], #chatbot button.reame-tool");
        const action = button && actionOf(button);
        if (!action) return;
        event.preventDefault();
        event.stopPropagation();
        const kind = action.split(":")[0];
        button.closest("details")?.removeAttribute("open");
        if (kind === "rename") return renameInline(button);
        if (kind === "delete" && !window.confirm(
            `Delete “${button.dataset.title}” and all its messages? This cannot be undone.`)) {
            return;
        }
        if (kind === "open" || kind === "branch") closeSidebarOnPhone();
        if (kind === "continue") {  // a reply that streams: an event of its own
            window.reameAction = action;
            return $("#reame-continue-btn").click();
        }
        send(action);
    }, true);

    // The address bar names the chat shown (?chat=ID; none for a new or no chat), the rest of
    // the address kept (a proxy's path, other parameters). Each chat opened is a step of the
    // history, which Back and Forward retrace; the page's own load and a step retraced add
    // none. The page shows the chat asked for when it loads (layout.py, ASKED_JS).
    let replaceUrl = true;
    window.reameShowUrl = (id) => {
        const url = new URL(location.href);
        const replace = replaceUrl;
        replaceUrl = false;
        if ((url.searchParams.get("chat") || "") === (id || "")) return;
        if (id) url.searchParams.set("chat", id);
        else url.searchParams.delete("chat");
        history[replace ? "replaceState" : "pushState"](history.state, "", url);
    };
    window.addEventListener("popstate", () => {
        const id = new URLSearchParams(location.search).get("chat") || "";
        const shown = $("#reame-shown textarea, #reame-shown input")?.value || "";
        if (id === shown) return;
        replaceUrl = true;  // the chat shown instead, if that one is not here: no new step
        if (/^\d+$/.test(id)) send(`open:${id}`);
        else if (!id) $("#new-chat")?.click();
        else send("open:0");
    });

    // On a phone the sidebar covers the chat: it starts closed, and closes once a chat is
    // picked or made (its button toggles it).
    const narrow = window.matchMedia("(max-width: 768px)");
    const closeSidebarOnPhone = () => {
        if (narrow.matches && $(".sidebar.open")) $(".sidebar .toggle-button")?.click();
    };
    const whenSidebar = () => ($(".sidebar") ? closeSidebarOnPhone()
        : requestAnimationFrame(whenSidebar));
    whenSidebar();
    window.reameCloseSidebarOnPhone = closeSidebarOnPhone;

    // When something was written, in the person's own time and words.
    const when = (seconds) => new Date(seconds * 1000).toLocaleString(
        undefined, {dateStyle: "medium", timeStyle: "short"});
    // Each message says on hover when it was written: its marker (render.when_marker, an
    // empty div of class reame-at-SECONDS) gives its bubble a title.
    const dateMessages = () => {
        for (const marker of document.querySelectorAll('#chatbot div[class^="reame-at-"]')) {
            const message = marker.closest("[data-testid=user], [data-testid=bot]");
            const seconds = Number(marker.className.match(/^reame-at-(\d+)/)?.[1]);
            const title = seconds ? when(seconds) : "";
            if (message && title && message.title !== title) message.title = title;
        }
    };
    // An edited message's box holds the message as the Chatbot has it: without what the
    // page adds under its text (its versions' buttons, its time).
    const ADDED = new RegExp('(?:\\s*<div class="reame-tools">[^\\n]*</div>)?'
                             + '\\s*<div class="reame-at-\\d+"></div>\\s*$');
    const cleanEdits = () => {
        for (const box of document.querySelectorAll("#chatbot textarea.edit-textarea")) {
            if (!ADDED.test(box.value)) continue;
            box.value = box.value.replace(ADDED, "");
            box.dispatchEvent(new Event("input", {bubbles: true}));
        }
    };
    // Gradio's footer links ("Use via API", "Built with Gradio") stay clickable but are no
    // Tab stops: from the message box, Tab goes round the page's own controls.
    const untabFooter = () => {
        for (const link of document.querySelectorAll("footer a, footer button")) {
            if (link.tabIndex !== -1) link.tabIndex = -1;
        }
    };

    // A chat's ⋯ menu opens whole, wherever its row is in the list's scroll box: placed
    // over the page (position: fixed), under its ⋯ or, if there is no room below, above it;
    // a scroll under it closes it.
    const placeMenu = (menu) => {
        const items = $(".reame-menu-items", menu);
        const anchor = $("summary", menu)?.getBoundingClientRect();
        if (!items || !anchor) return;
        Object.assign(items.style, {top: "0px", left: "0px"});
        // Where (0, 0) lands: a transformed sidebar (Gradio slides it) moves it.
        const origin = items.getBoundingClientRect();
        const width = items.offsetWidth, height = items.offsetHeight;
        const room = window.innerHeight - 4;
        let top = anchor.bottom + height <= room || anchor.top - height < 4
            ? anchor.bottom : anchor.top - height;
        top = Math.max(4, Math.min(top, room - height));
        const left = Math.max(4, Math.min(anchor.right - width, window.innerWidth - width - 4));
        Object.assign(items.style, {top: `${top - origin.top}px`,
                                    left: `${left - origin.left}px`});
        items.dataset.placed = "true";
    };
    document.addEventListener("toggle", (event) => {
        const menu = event.target;
        if (!menu.matches?.("#chat-list details.reame-menu")) return;
        if (menu.open) placeMenu(menu);
        else delete $(".reame-menu-items", menu)?.dataset.placed;
    }, true);
    const closeMenus = (under) => {
        for (const menu of document.querySelectorAll("#chat-list details.reame-menu[open]")) {
            if (!under || under.contains?.(menu)) menu.removeAttribute("open");
        }
    };
    document.addEventListener("scroll", (event) => {
        if (!event.target.closest?.(".reame-menu-items")) {
            closeMenus(event.target === document ? null : event.target);
        }
    }, true);
    window.addEventListener("resize", () => closeMenus(null));

    // The chat list: rows grouped by the browser's own days; arrow keys move between rows.
    const groupOf = (seconds) => {
        const day = (d) => new Date(d.getFullYear(), d.getMonth(), d.getDate()).getTime();
        const when = new Date(seconds * 1000);
        const days = Math.round((day(new Date()) - day(when)) / 86400000);
        if (days <= 0) return "Today";
        if (days === 1) return "Yesterday";
        if (days < 7) return "Previous 7 days";
        if (days < 30) return "Previous 30 days";
        return when.toLocaleDateString(undefined, {month: "long", year: "numeric"});
    };
    const arrange = (nav) => {
        if (nav.dataset.arranged) return;
        nav.dataset.arranged = "true";
        const list = nav.querySelector("ul.reame-rows");
        if (list && nav.dataset.searching !== "true") {
            // One heading and one list per group.
            const groups = document.createDocumentFragment();
            let rows = null, last = null;
            for (const row of [...list.children]) {
                const group = row.dataset.pinned === "true" ? "Pinned"
                    : groupOf(Number(row.dataset.updated));
                if (group !== last) {
                    const heading = document.createElement("h3");
                    heading.className = "reame-group";
                    heading.textContent = group;
                    rows = document.createElement("ul");
                    rows.className = "reame-rows";
                    groups.append(heading, rows);
                    last = group;
                }
                rows.append(row);
            }
            list.replaceWith(groups);
        }
        const buttons = nav.querySelectorAll(".reame-open");
        for (const button of buttons) {  // its title, and when it was last written in
            const updated = Number(button.closest(".reame-row")?.dataset.updated);
            if (updated) button.title = `${button.dataset.title}\nLast updated ${when(updated)}`;
        }
        if (buttons.length && !nav.querySelector('.reame-open[tabindex="0"]')) {
            buttons[0].tabIndex = 0;
        }
        rove(nav.querySelector('.reame-open[tabindex="0"]'));
    };
    // The list is one Tab stop (its chosen row), and that row's ⋯ the next: the other rows'
    // ⋯ buttons are reached with the arrow keys, by moving to their row.
    const rove = (chosen) => {
        if (!chosen) return;
        for (const button of document.querySelectorAll("#chat-list .reame-open")) {
            button.tabIndex = button === chosen ? 0 : -1;
            const menu = button.closest(".reame-row")?.querySelector("summary");
            if (menu) menu.tabIndex = button === chosen ? 0 : -1;
        }
    };
    // Gradio's send and stop buttons are icons without a name: say what they do.
    const NAMES = {"#message [data-testid=submit-button]": "Send",
                   "#message [data-testid=stop-button]": "Stop the reply"};
    const name = () => {
        for (const [selector, label] of Object.entries(NAMES)) {
            for (const button of document.querySelectorAll(selector)) {
                if (!button.getAttribute("aria-label")) button.setAttribute("aria-label", label);
            }
        }
    };
    new MutationObserver(() => {
        document.querySelectorAll("#chat-list nav.reame-chats").forEach(arrange);
        name();
        dateMessages();
        cleanEdits();
        untabFooter();
        firstWords();
        showWriting();
    }).observe(document.body, {childList: true, subtree: true});

    // While a reply is written, Enter keeps the next message in the box and says why, instead
    // of sending it into the reply under way.
    const writing = () => {
        const stop = $("#message [data-testid=stop-button]");
        return stop !== null && stop.offsetParent !== null;
    };
    const hint = (text) => {
        let note = $("#reame-hint");
        if (!note) {
            note = document.createElement("div");
            note.id = "reame-hint";
            note.setAttribute("role", "status");
            $("#message").after(note);
        }
        note.textContent = text;
        clearTimeout(note.timer);
        note.timer = setTimeout(() => { note.textContent = ""; }, 6000);
    };
    window.reameHint = hint;  // page_edges.js says things there too
    document.addEventListener("keydown", (event) => {
        if (event.key === "Enter" && !event.shiftKey && !event.isComposing
                && event.target.closest?.("#message") && writing()) {
            event.preventDefault();
            event.stopImmediatePropagation();
            hint("A reply is being written: your message stays here until it ends. " +
                 "Press Esc to stop it.");
        }
    }, true);

    // What the person waited, from Enter (or Send) to the first words of the reply on the
    // screen, measured here and told to the server (layout.py, #reame-waited) for the reply's
    // stats line: the server alone sees neither the way there nor the way back.
    let pressed = null;  // {at: the press's time, bots: the replies shown then}
    const bubbles = () => document.querySelectorAll(
        "#chatbot [data-testid=user], #chatbot [data-testid=bot]");
    const bots = () => document.querySelectorAll("#chatbot [data-testid=bot]");
    // The last message shown, when it is a reply with words in it (not its place in line).
    const replyWithWords = () => {
        const all = bubbles(), last = all[all.length - 1];
        return last?.dataset.testid === "bot" && last.innerText.trim()
            && !last.querySelector(".reame-queued, .reame-reading") ? last : null;
    };
    const press = (event) => {
        if (writing() || !$("#message textarea")?.value.trim()) return;
        pressed = {at: event.timeStamp, bots: bots().length};
    };
    document.addEventListener("keydown", (event) => {
        if (event.key === "Enter" && !event.shiftKey && !event.isComposing
                && event.target.closest?.("#message")) press(event);
    }, true);
    document.addEventListener("click", (event) => {
        if (event.target.closest?.("#message [data-testid=submit-button]")) press(event);
    }, true);
    const firstWords = () => {
        if (!pressed) return;
        const reply = replyWithWords();
        if (!reply || bots().length <= pressed.bots
                || /^Loading model/.test(reply.innerText.trim())) {
            return;
        }
        const at = pressed.at;
        pressed = null;
        requestAnimationFrame(() => {  // drawn: on the screen
            const box = $("#reame-waited textarea, #reame-waited input");
            if (!box) return;
            box.value = ((performance.now() - at) / 1000).toFixed(3);
            box.dispatchEvent(new Event("input", {bubbles: true}));
            setTimeout(() => $("#reame-waited-btn")?.click(), 0);
        });
    };

    // While a reply is read and written, a quiet line under the message box says so (Gradio's
    // own progress text is off: layout.py).
    const showWriting = () => {
        let note = $("#reame-busy");
        if (!note) {
            const box = $("#message");
            if (!box) return;
            note = document.createElement("div");
            note.id = "reame-busy";
            note.setAttribute("role", "status");
            box.after(note);
        }
        let text = "";
        if (writing()) text = replyWithWords() ? "Writing…" : "Reading…";
        if (note.textContent !== text) note.textContent = text;
    };

    document.addEventListener("keydown", (event) => {
        const inList = event.target.closest?.("#chat-list .reame-open");
        if (inList && (event.key === "ArrowDown" || event.key === "ArrowUp")) {
            event.preventDefault();
            const buttons = [...document.querySelectorAll("#chat-list .reame-open")];
            const at = buttons.indexOf(inList) + (event.key === "ArrowDown" ? 1 : -1);
            const next = buttons[Math.max(0, Math.min(buttons.length - 1, at))];
            rove(next);
            next.focus();
            return;
        }
        const key = event.key.toLowerCase();
        if ((event.ctrlKey || event.metaKey) && event.shiftKey && key === "o") {
            event.preventDefault();
            $("#new-chat")?.click();
        } else if ((event.ctrlKey || event.metaKey) && !event.shiftKey && key === "k") {
            event.preventDefault();
            if (!$(".sidebar.open")) $(".sidebar .toggle-button")?.click();
            $("#chat-search textarea, #chat-search input")?.focus();
        } else if (event.key === "Escape" && !event.target.closest?.(".reame-rename")
                   && writing()) {
            event.preventDefault();
            $("#message [data-testid=stop-button]").click();
            $("#message textarea")?.focus();
        }
    });

    // A document's ✕ in the strip above the message box (attachments.py): its place goes
    // through the hidden textbox to the hidden button's event.
    document.addEventListener("click", (event) => {
        const button = event.target.closest?.("[data-reame-detach]");
        if (!button) return;
        const box = $("#reame-detach textarea, #reame-detach input");
        box.value = button.dataset.reameDetach;
        box.dispatchEvent(new Event("input", {bubbles: true}));
        setTimeout(() => $("#reame-detach-btn")?.click(), 0);
    });

    // Copying a message copies its text: without the stats line, the tools, the window
    // marker and the time that the page adds to it (all <div class="reame-...">, never
    // nested).
    const clipboard = navigator.clipboard;
    if (clipboard && clipboard.writeText) {
        const write = clipboard.writeText.bind(clipboard);
        clipboard.writeText = (text) => write(String(text)
            .replace(/\s*<div class="reame-[a-z0-9-]+">[\s\S]*?<\/div>/g, "").trimEnd());
    }
}
